"""`crossover validate SPEC`: load the spec, print warnings and a short summary."""

from __future__ import annotations

import argparse
import sys

from crossover.spec import load_spec, slo_warnings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="fleet spec YAML file")
    parser.add_argument("--quiet", "-q", action="store_true", help="print nothing on success")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    for warning in slo_warnings(spec, args.spec):
        print(f"warning: {warning}", file=sys.stderr)
    if not args.quiet:
        print(f"{args.spec}: ok: model {spec.model.name}, {len(spec.topologies)} topologies")
        for topology in spec.topologies:
            roles = ",".join(sorted({i.role.value for i in topology.instances}))
            target = topology.entrypoint.url or f"client-side {topology.entrypoint.balance.value}"  # type: ignore[union-attr]
            # where its request figures come from (docs/routers.md)
            dialect = topology.entrypoint.dialect or "dialect detected"
            router_pods = topology.entrypoint.selector or {}
            entrypoint_metrics = topology.entrypoint.metrics_url or "pods " + ",".join(
                f"{k}={v}" for k, v in sorted(router_pods.items())) + f" port {topology.entrypoint.port}"
            source = {"entrypoint": f"; entrypoint metrics {entrypoint_metrics} ({dialect})",
                      "decode": "; decode-side request figures (no entrypoint metrics)",
                      "instances": ""}[topology.configured_requests_source]
            if topology.discovered:
                selector = ",".join(f"{k}={v}" for k, v in sorted(topology.selector.items()))
                kind = "prefill,decode" if topology.pd else "colocated"
                shape = (f"pods of {selector} in {spec.kubernetes.namespace} ({kind}) x "
                         f"TP={topology.tensor_parallel_size} GPUs")
            else:
                tp = (f"TP={topology.tensor_parallel_size} x {len(topology.instances)}"
                      if len(topology.tp_sizes) == 1  # else each instance's own (P/D roles' own TP)
                      else "TP=" + "+".join(str(topology.tp_of(i)) for i in topology.instances))
                shape = f"{topology.gpus} GPUs, {tp} ({roles})"
            print(f"  {topology.name}: {shape}, traffic to {target}{source}")
        slos = ", ".join(f"{k} {v:g} ms" for k, v in spec.slos.thresholds_ms.items())
        print(f"  SLOs: {slos}; objective {spec.slos.objective} over {spec.slos.period}")
    return 0
