"""Write the dashboards for one spec, Grafana provisioning, and the committed examples.

`python -m crossover.dashboards.generate CHECKOUT` rewrites dashboards/generated/<spec-stem>/*.json for
every compose/specs/*.yaml of a checkout, the same dashboards as Kubernetes objects in
rules/generated/<spec-stem>/ (dashboards/kube.py) and the provisioning files under compose/grafana/.
"""

from __future__ import annotations

import sys
from pathlib import Path

from crossover.dashboards.kube import kubernetes_files
from crossover.dashboards.model import DATASOURCE_UID, dashboards
from crossover.dashboards.render import to_json
from crossover.rules.generate import checkout_from_argv, write_examples
from crossover.rules.model import RulesConfig, RuleSet, build_rules
from crossover.rules.render import dump, header
from crossover.spec import load_spec

GRAFANA_DASHBOARDS_PATH = "/var/lib/grafana/dashboards/crossover"  # where compose mounts dashboards/generated


def dashboard_files(rules: RuleSet, stem: str) -> dict[str, str]:
    """File name -> dashboard JSON (overlay, slo and, for a P/D fleet, pd)."""
    return {f"{d.uid.removeprefix(f'xo-{stem}-')}.json": to_json(d) for d in dashboards(rules, stem)}


def datasource_provisioning(url: str = "http://prometheus:9090") -> str:
    data = {"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "type": "prometheus", "uid": DATASOURCE_UID, "access": "proxy", "url": url,
        "isDefault": True, "editable": False, "jsonData": {"timeInterval": "5s"}}]}
    return dump(data, header("crossover/dashboards/generate.py", "python -m crossover.dashboards.generate"))


def dashboard_provisioning(path: str = GRAFANA_DASHBOARDS_PATH) -> str:
    data = {"apiVersion": 1, "providers": [{
        # One Grafana folder per spec (the sub-folders of dashboards/generated).
        "name": "vllm-crossover", "orgId": 1, "type": "file",
        "disableDeletion": False, "allowUiUpdates": False, "updateIntervalSeconds": 30,
        "options": {"path": path, "foldersFromFilesStructure": True}}]}
    return dump(data, header("crossover/dashboards/generate.py", "python -m crossover.dashboards.generate"))


def example_outputs(repo: Path) -> dict[Path, str]:
    files: dict[Path, str] = {}
    for spec_path in sorted((repo / "compose" / "specs").glob("*.yaml")):
        stem = spec_path.stem
        source = spec_path.relative_to(repo).as_posix()
        spec = load_spec(spec_path)
        rules = build_rules(spec, RulesConfig(), source)
        generated = dashboard_files(rules, stem)
        for name, text in generated.items():
            files[repo / "dashboards" / "generated" / stem / name] = text
        # Beside the PrometheusRule and PodMonitors: one `kubectl apply -f` folder per spec.
        for name, text in kubernetes_files(spec, stem, generated, source).items():
            files[repo / "rules" / "generated" / stem / name] = text
    provisioning = repo / "compose" / "grafana" / "provisioning"
    files[provisioning / "datasources" / "crossover.yml"] = datasource_provisioning()
    files[provisioning / "dashboards" / "crossover.yml"] = dashboard_provisioning()
    return files


def main(argv: list[str]) -> int:
    repo = checkout_from_argv(argv)
    write_examples(example_outputs(repo), repo)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
