"""Write every file `crossover rules` produces for one spec, and the committed examples.

`outputs(...)` returns {relative path: text} so tests compare without touching the disk;
`python -m crossover.rules.generate CHECKOUT` rewrites the committed examples of a checkout for
its compose/specs/*.yaml (scripts/generate runs it); the installed package reads no checkout.
"""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path

from crossover.rules.alertmanager import alertmanager_yaml
from crossover.rules.model import RulesConfig, RuleSet, build_rules
from crossover.rules.promtest import build_promtest
from crossover.rules.render import (
    kubernetes_sd_yaml,
    pod_monitor_yaml,
    prometheus_rule_yaml,
    rules_yaml,
    scrape_config_yaml,
    service_monitor_yaml,
)
from crossover.spec import FleetSpec, load_spec

RULES_FILE = "rules.yml"
TEST_FILE = "rules.test.yml"
SCRAPE_FILE = "prometheus.yml"
PROMETHEUS_RULE_FILE = "prometheusrule.yaml"
POD_MONITOR_FILE = "podmonitor.yaml"
SERVICE_MONITOR_FILE = "servicemonitor.yaml"
# The operator folder holds only Kubernetes objects at its top, so `kubectl apply -f DIR` (which
# reads the .yaml/.yml/.json files of DIR, not its sub-folders) sets a cluster up; the files for
# promtool and a plain Prometheus sit in sub-folders it skips.
PROMTOOL_DIR = "promtool"
KUBERNETES_SD_FILE = "prometheus/kubernetes-sd.yml"


class Format(StrEnum):
    PLAIN = "plain"
    OPERATOR = "operator"


# The compose stack's service names (compose/docker-compose.yml) for specs named compose-*.
COMPOSE_EXPORTER = "exporter:9400"
COMPOSE_ALERTMANAGER = "alertmanager:9093"


def outputs(spec: FleetSpec, rules: RuleSet, fmt: Format, source: str, name: str,
            exporter_target: str | None = None, alertmanager_target: str | None = None) -> dict[str, str]:
    """File name -> content for one output folder."""
    if fmt is Format.OPERATOR:
        return {PROMETHEUS_RULE_FILE: prometheus_rule_yaml(rules, source, name),
                POD_MONITOR_FILE: pod_monitor_yaml(spec, source, name),
                SERVICE_MONITOR_FILE: service_monitor_yaml(spec, source, name),
                KUBERNETES_SD_FILE: kubernetes_sd_yaml(spec, source),
                f"{PROMTOOL_DIR}/{TEST_FILE}": build_promtest(rules, RULES_FILE, source),
                f"{PROMTOOL_DIR}/{RULES_FILE}": rules_yaml(rules, source)}
    return {SCRAPE_FILE: scrape_config_yaml(spec, source, [RULES_FILE], exporter_target, alertmanager_target),
            RULES_FILE: rules_yaml(rules, source),
            TEST_FILE: build_promtest(rules, RULES_FILE, source)}


def _compose_files(spec: FleetSpec, rules: RuleSet, source: str, stem: str) -> dict[str, str]:
    """prometheus.yml and rules.yml for compose/prometheus/<stem>/ (no unit test there)."""
    in_compose = stem.startswith("compose-")
    scrape = scrape_config_yaml(spec, source, [RULES_FILE], COMPOSE_EXPORTER if in_compose else None,
                                COMPOSE_ALERTMANAGER if in_compose else None)
    return {SCRAPE_FILE: scrape, RULES_FILE: rules_yaml(rules, source)}


def example_outputs(repo: Path) -> dict[Path, str]:
    """Every committed generated file for the example specs, keyed by absolute path."""
    files: dict[Path, str] = {}
    for spec_path in sorted((repo / "compose" / "specs").glob("*.yaml")):
        stem = spec_path.stem
        source = spec_path.relative_to(repo).as_posix()
        spec = load_spec(spec_path)
        rules = build_rules(spec, RulesConfig(), source)
        for name, text in outputs(spec, rules, Format.OPERATOR, source, stem).items():
            files[repo / "rules" / "generated" / stem / name] = text
        # compose mounts compose/prometheus at /etc/prometheus: config and rules side by side.
        for name, text in _compose_files(spec, rules, source, stem).items():
            files[repo / "compose" / "prometheus" / stem / name] = text
    files[repo / "compose" / "alertmanager" / "alertmanager.yml"] = alertmanager_yaml()
    return files


def write(files: dict[Path, str]) -> list[Path]:
    changed = []
    for path, text in files.items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            changed.append(path)
    return changed


def checkout_from_argv(argv: list[str]) -> Path:
    """The checkout whose committed examples a generator rewrites: the one argument, or the cwd."""
    repo = Path(argv[0] if argv else ".").resolve()
    if not (repo / "compose" / "specs").is_dir():
        raise SystemExit(f"{repo}: not a vllm-crossover checkout (no compose/specs/)")
    return repo


def write_examples(files: dict[Path, str], repo: Path) -> None:
    for path in write(files):
        print(f"wrote {path.relative_to(repo)}", file=sys.stderr)


def main(argv: list[str]) -> int:
    repo = checkout_from_argv(argv)
    write_examples(example_outputs(repo), repo)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
