"""`crossover dashboards SPEC --out DIR`: Grafana dashboard JSON built with grafanalib."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from crossover.dashboards.generate import dashboard_files, dashboard_provisioning, datasource_provisioning
from crossover.dashboards.kube import kubernetes_files
from crossover.dashboards.lint import known_names, lint
from crossover.dashboards.schema import V1_API_VERSION, resource_v1
from crossover.errors import UserError
from crossover.netutil import check_http_url
from crossover.outdir import write_into
from crossover.rules.model import DEFAULT_SELECTOR, RulesConfig, build_rules
from crossover.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SPEC", help="fleet spec YAML file")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the dashboards into")
    parser.add_argument("--selector", default=DEFAULT_SELECTOR,
                        help="PromQL matchers of the vLLM series; must match `crossover rules --selector`")
    parser.add_argument("--provisioning", action="store_true",
                        help="also write Grafana provisioning files (datasource with a fixed uid, provider)")
    parser.add_argument("--prometheus-url", default="http://prometheus:9090",
                        help="datasource URL in the provisioning file")
    parser.add_argument("--form", choices=("classic", "v1"), default="classic",
                        help="classic dashboard JSON (file provisioning, import), or each dashboard as a "
                             f"Grafana 12.2+ {V1_API_VERSION} resource wrapping it (docs/dashboards.md)")
    parser.add_argument("--kubernetes", action="store_true",
                        help="also write the dashboards as ConfigMaps (Grafana sidecar) and "
                             "GrafanaDashboards (Grafana Operator) per the spec's kubernetes.dashboards; "
                             "give "
                             "the --out of `crossover rules --format operator` for one `kubectl apply -f` "
                             "folder")


def run(args: argparse.Namespace) -> int:
    try:
        check_http_url(args.prometheus_url)
    except ValueError as exc:
        raise UserError(f"--prometheus-url: {exc}") from None
    spec = load_spec(args.spec)
    rules = build_rules(spec, RulesConfig(selector=args.selector), args.spec)
    for warning in rules.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    stem = Path(args.spec).stem
    files = dashboard_files(rules, stem)
    known = known_names(rules)
    for name, text in files.items():
        problems = lint(json.loads(text), known)
        if problems:  # a generator bug, not a user mistake: say so plainly
            raise RuntimeError(f"generated dashboard {name} fails the lint: {problems[0]}")
    # The Kubernetes objects embed the classic JSON whatever --form writes beside them.
    objects = kubernetes_files(spec, stem, files, args.spec) if args.kubernetes else {}
    if args.form == "v1":
        files = {name: json.dumps(resource_v1(json.loads(text)), sort_keys=True, indent=2) + "\n"
                 for name, text in files.items()}
    if args.kubernetes:
        # kubectl apply -f DIR reads every .json at DIR's top: the plain JSON goes one level down.
        files = {f"dashboards/{name}": text for name, text in files.items()} | objects
    if args.provisioning:
        files["provisioning/datasources/crossover.yml"] = datasource_provisioning(args.prometheus_url)
        files["provisioning/dashboards/crossover.yml"] = dashboard_provisioning(str(Path(args.out).resolve()))
    out = Path(args.out)
    write_into(out, files)
    print(f"wrote {', '.join(sorted(files))} into {out}")
    return 0
