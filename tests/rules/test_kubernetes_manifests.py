"""Every generated Kubernetes manifest validates offline against the vendored Kubernetes,
Prometheus Operator and Grafana Operator schemas (tests/kube_schema.py), and the check catches
the mistakes it is there for."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO
from tests.kube_schema import KINDS, manifest_problems, problems

FOLDERS = sorted(p for p in (REPO / "rules" / "generated").iterdir() if p.is_dir())
# kubectl apply -f DIR reads these extensions at the folder's top, not its sub-folders.
MANIFESTS = sorted(p for folder in FOLDERS for p in folder.iterdir()
                   if p.is_file() and p.suffix in (".yaml", ".yml", ".json"))


def test_every_example_folder_carries_every_kind() -> None:
    assert len(FOLDERS) >= 7
    for folder in FOLDERS:
        kinds = {(d["apiVersion"], d["kind"]) for p in folder.glob("*.yaml")
                 for d in yaml.safe_load_all(p.read_text()) if d}
        assert kinds == set(KINDS), f"{folder.name}: {sorted(set(KINDS) - kinds)}"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_manifest_validates(path: Path) -> None:
    """What `kubectl apply -f rules/generated/<spec>` reads: every top-level file of the folder."""
    assert manifest_problems(path.read_text()) == []


def _first(name: str, kind: str) -> dict:
    text = (REPO / "rules" / "generated" / "k8s-llm-d-pd" / name).read_text()
    return next(d for d in yaml.safe_load_all(text) if d and d["kind"] == kind)


@pytest.mark.parametrize(("file", "kind", "break_it", "expected"), [
    # prometheus.yml's spelling inside an Operator resource
    ("podmonitor.yaml", "PodMonitor",
     lambda d: d["spec"]["podMetricsEndpoints"][0]["relabelings"][0].update(source_labels=["x"]),
     "Additional properties are not allowed ('source_labels'"),
    ("podmonitor.yaml", "PodMonitor", lambda d: d["spec"].update(podMetricEndpoints=[]),
     "podMetricEndpoints"),
    ("servicemonitor.yaml", "ServiceMonitor",
     lambda d: d["spec"]["endpoints"][0]["relabelings"][0].update(action="Keepp"), "Keepp"),
    ("prometheusrule.yaml", "PrometheusRule", lambda d: d["spec"]["groups"][0].pop("name"),
     "'name' is a required"),
    ("grafana-dashboards.yaml", "GrafanaDashboard", lambda d: d["spec"].update(json={"a": 1}),
     "is not of type 'string'"),
    ("grafana-dashboards-configmaps.yaml", "ConfigMap",
     lambda d: d["metadata"]["labels"].update(grafana_dashboard=1), "not a label value"),
    ("grafana-dashboards-configmaps.yaml", "ConfigMap", lambda d: d["metadata"].update(name="Overlay_1"),
     "not a DNS subdomain"),
    ("podmonitor.yaml", "PodMonitor", lambda d: d.update(apiVersion="monitoring.coreos.com/v1alpha1"),
     "no vendored schema"),
])
def test_a_broken_manifest_fails(file: str, kind: str, break_it, expected: str) -> None:
    doc = _first(file, kind)
    assert problems(doc) == []
    broken = copy.deepcopy(doc)
    break_it(broken)
    found = problems(broken)
    assert any(expected in p for p in found), found


def test_one_folder_from_both_clis_is_what_kubectl_apply_takes(tmp_path: Path) -> None:
    """`crossover rules --format operator` and `crossover dashboards --kubernetes` into one --out:
    every file kubectl would read (the folder's top) is a valid object, and every kind is there."""
    from crossover.cli import main

    spec = str(REPO / "compose" / "specs" / "k8s-production-stack.yaml")
    assert main(["rules", spec, "--format", "operator", "--out", str(tmp_path)]) == 0
    assert main(["dashboards", spec, "--kubernetes", "--out", str(tmp_path)]) == 0
    top = sorted(p for p in tmp_path.iterdir() if p.is_file())
    assert [p.suffix for p in top] == [".yaml"] * len(top)
    kinds = set()
    for path in top:
        assert manifest_problems(path.read_text()) == [], path.name
        kinds |= {d["kind"] for d in yaml.safe_load_all(path.read_text()) if d}
    assert kinds == {kind for _, kind in KINDS}
    assert (tmp_path / "dashboards" / "overlay.json").is_file()
    assert (tmp_path / "promtool" / "rules.test.yml").is_file()


def test_a_sweep_of_a_selector_topology_is_a_one_line_error() -> None:
    """Its pods and GPUs are known only to the cluster: the sweep says so instead of dividing by 0."""
    from crossover.errors import UserError
    from crossover.loadgen.sweep import topology_info
    from crossover.spec import load_spec

    spec = load_spec(REPO / "compose" / "specs" / "k8s-llm-d-pd.yaml")
    with pytest.raises(UserError, match="topology pd: a selector topology has no instances or GPU count"):
        topology_info(spec.topology("pd"))
