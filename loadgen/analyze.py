"""`crossover analyze DIR|FILES`: the crossover, capacities, table and sentences from result files
of `vllm bench serve --save-result --save-detailed` (one per topology and level; the topology from
`--metadata topology=NAME` or the file's folder), or from a sweep's own `--save-result` files.
With --out it also writes a run folder, which the app opens like any past sweep."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from crossover.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="DIR|FILE",
                        help="vllm bench serve result files or folders")
    parser.add_argument("--spec", default=None,
                        help="fleet spec: the topologies' GPUs, the SLOs and objective")
    parser.add_argument("--goodput", "--slo", nargs="+", action="extend", default=[], metavar="NAME:MS",
                        help="SLOs as vllm bench serve takes them, e.g. --goodput ttft:2500 tpot:50")
    parser.add_argument("--objective", type=float, default=None, help="share of good requests (0.99)")
    parser.add_argument("--gpus", action="append", default=[], metavar="TOPOLOGY=N",
                        help="GPUs of a topology (else --metadata gpus=N in the files, the spec, or 1)")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for intervals")
    parser.add_argument("--out", default=None, help="also write a run folder here (the app opens it)")


def _gpus(args: argparse.Namespace, files: list[Any], spec: Any) -> dict[str, int]:
    gpus: dict[str, int] = {}
    for f in files:
        value = f.data.get("gpus")
        if value is not None:
            try:
                gpus[f.topology] = int(value)
            except ValueError:
                raise UserError(f"{f.path}: metadata gpus={value!r} is not a whole number") from None
    for topology in spec.topologies if spec is not None else []:
        gpus.setdefault(topology.name, topology.gpus)
    for item in args.gpus:
        name, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"--gpus {item!r}: want TOPOLOGY=N with N a positive whole number")
        gpus[name] = int(value)
    return {f.topology: gpus.get(f.topology, 1) for f in files}


def run(args: argparse.Namespace) -> int:
    import pandas as pd
    from rich.console import Console

    from crossover.loadgen import results
    from crossover.loadgen.benchjson import read_bench_results, requests_frame
    from crossover.loadgen.cli import print_summary
    from crossover.loadgen.crossover import analyze
    from crossover.loadgen.plan import Mode, SweepPlan, parse_slo_overrides
    from crossover.loadgen.results import RunInfo, TopologyInfo
    from crossover.loadgen.summary import summarize
    from crossover.spec import load_spec

    if args.bootstrap < 0:
        raise UserError(f"--bootstrap: must be zero or positive, got {args.bootstrap}")
    spec = load_spec(args.spec) if args.spec else None
    slos_ms = parse_slo_overrides(args.goodput) or (spec.slos.thresholds_ms if spec is not None else {})
    if not slos_ms:
        raise UserError("give the SLOs with --goodput ttft:MS tpot:MS (or a --spec with slos)")
    objective = args.objective if args.objective is not None else (spec.slos.objective if spec else 0.99)
    if not 0 < objective < 1:
        raise UserError(f"--objective: must be between 0 and 1, got {objective}")
    files = read_bench_results(args.paths)
    axis = files[0].axis
    requests = pd.concat([requests_frame(f) for f in files], ignore_index=True)
    gpus = _gpus(args, files, spec)
    order = list(dict.fromkeys(sorted(f.topology for f in files)))
    plan = SweepPlan(mode=Mode.CLOSED if axis == "concurrency" else Mode.OPEN,
                     levels=tuple(sorted({f.level for f in files})),
                     requests_per_level=max(len(f.data["ttfts"]) for f in files) or 1, slos_ms=slos_ms,
                     objective=objective)
    summary = summarize(requests, slos_ms, gpus, plan)
    crossover = analyze(summary, requests, axis=axis, objective=objective, slos_ms=slos_ms, plan=plan,
                        n_boot=args.bootstrap, seed=0, order=order)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    print_summary(summary, crossover, out)
    if args.out:
        folder = Path(args.out)
        model = str(files[0].data.get("model_id", ""))
        info = RunInfo(plan=plan, slos_ms=dict(slos_ms), objective=objective, model=model,
                       topologies={name: TopologyInfo(name, gpus[name], (), "imported") for name in order})
        results.prepare(folder, info)
        for (topology, level), frame in requests.groupby(["topology", "level"], sort=True):
            results.write_level(folder, plan, str(topology), float(level), frame.reset_index(drop=True))  # type: ignore[arg-type]
        results.write_summary(folder, summary)
        results.write_json(folder / results.CROSSOVER_FILE, crossover)
        out.print(f"run folder in {folder} (crossover app SPEC opens it)")
    return 0
