"""`crossover rules SPEC --out DIR [--format plain|operator]`."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from crossover.errors import UserError
from crossover.outdir import write_into
from crossover.rules.generate import Format, outputs
from crossover.rules.model import DEFAULT_SELECTOR, RulesConfig, build_rules
from crossover.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="fleet spec YAML file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the files into")
    parser.add_argument("--format", choices=[f.value for f in Format], default=Format.PLAIN.value,
                        help="plain: prometheus.yml + rules.yml + rules.test.yml; operator: Kubernetes "
                             "objects (PrometheusRule, PodMonitors, ServiceMonitors) for `kubectl apply -f "
                             "DIR`, plus prometheus/kubernetes-sd.yml and promtool/ in sub-folders")
    parser.add_argument("--selector", default=DEFAULT_SELECTOR,
                        help=f"PromQL matchers that select the vLLM series (default {DEFAULT_SELECTOR})")
    parser.add_argument("--window-scale", type=float, default=1.0, metavar="F",
                        help="shrink the SLO period and every alert window by F (0 < F <= 1) for a test "
                             "profile whose alerts fire within minutes, e.g. 0.0005")
    parser.add_argument("--kv-transfer-p99-ms", type=float, default=500.0, metavar="MS",
                        help="alert when the p99 KV-transfer time exceeds this (default 500)")
    parser.add_argument("--refuse-off-boundary", action="store_true",
                        help="refuse an SLO that is not a histogram bucket boundary instead of rounding it "
                             "down to the stricter neighbour")
    parser.add_argument("--runbook-base", default="docs/runbooks.md", metavar="URL",
                        help="where runbook_url annotations point (an anchor per alert is appended)")
    parser.add_argument("--exporter-target", metavar="HOST:PORT",
                        help="also scrape the crossover exporter at HOST:PORT (plain format)")
    parser.add_argument("--alertmanager", metavar="HOST:PORT",
                        help="send alerts to this Alertmanager (plain format)")


# A DNS name, an IPv4 address or a bracketed IPv6 address, then a port: what Prometheus accepts
# as a static target.
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):([0-9]{1,5})")


def host_port(value: str, flag: str, example: str) -> str:
    match = _HOST_PORT.fullmatch(value)
    if not match or not 0 < int(match.group(2)) < 65536:
        raise UserError(f"{flag}: {value!r} is not HOST:PORT (e.g. {example})")
    return value


def _check_flags(args: argparse.Namespace) -> None:
    for flag, value, example in (("--exporter-target", args.exporter_target, "exporter:9400"),
                                 ("--alertmanager", args.alertmanager, "alertmanager:9093")):
        if value is None:
            continue
        host_port(value, flag, example)
        if args.format != Format.PLAIN.value:
            # Dropping it silently would leave the operator without the scrape job or alerting
            # they asked for; on Kubernetes those come from their own resources.
            raise UserError(f"{flag}: only with --format plain "
                            "(the operator format writes no prometheus.yml)")
    if not args.runbook_base.strip() or "#" in args.runbook_base:
        raise UserError(f"--runbook-base: {args.runbook_base!r} must be a non-empty URL or path without '#' "
                        "(each alert appends #<its name>)")


def run(args: argparse.Namespace) -> int:
    _check_flags(args)
    spec = load_spec(args.spec)
    config = RulesConfig(selector=args.selector, window_scale=args.window_scale,
                         kv_transfer_p99_ms=args.kv_transfer_p99_ms,
                         refuse_off_boundary=args.refuse_off_boundary, runbook_base=args.runbook_base)
    rules = build_rules(spec, config, args.spec)
    for warning in rules.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    out = Path(args.out)
    files = outputs(spec, rules, Format(args.format), args.spec, Path(args.spec).stem,
                    args.exporter_target, args.alertmanager)
    write_into(out, files)
    print(f"wrote {', '.join(sorted(files))} into {out} ({len(rules.records)} recording rules, "
          f"{len(rules.alerts)} alerts)")
    return 0
