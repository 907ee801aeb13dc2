"""Live: the generated Kubernetes relabelling runs in a real Prometheus and turns pods, labelled as
llm-d labels them, into the labels the rules and dashboards read; the exporter's discovery maps the
same pods the same way from Prometheus's /api/v1/targets.

The pods are file_sd targets carrying the `__meta_kubernetes_*` labels Kubernetes discovery would set
(a pod label k as __meta_kubernetes_pod_label_<k sanitised> plus ..._labelpresent_<k>="true":
prometheus/prometheus discovery/kubernetes/kubernetes.go addObjectAnnotationsAndLabels). Labels a
file_sd target carries, `__meta_*` included, are seen by relabelling and dropped after it like any
label starting with `__` (scrape/target.go PopulateLabels and Target.Labels), so the job runs here
exactly as it would against the API server, only its discovery differs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover.exporter.targets import discovered_pods
from crossover.kube import (
    CONTAINER_PORT_NAME,
    POD_NAME,
    POD_NAMESPACE,
    pod_label,
    pod_label_present,
    pod_targets,
)
from crossover.rules.prom import running_prometheus
from crossover.rules.render import kubernetes_sd_jobs
from crossover.spec import load_spec
from tests.helpers import SPECS, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(120)]

SPEC = load_spec(SPECS / "k8s-llm-d-pd.yaml")

# (pod, container port name, port, pod labels, what it must become: (topology, role) or None = not scraped)
PODS: list[tuple[str, str, int, dict[str, str], tuple[str, str] | None]] = [
    # llm-d labels a plain pool's pods decode too: a topology that is not P/D reads no role.
    ("plain-a", "http", 9101, {"app": "llama-8b", "llm-d.ai/role": "decode"}, ("colocated", "colocated")),
    ("plain-b", "http", 9102, {"app": "llama-8b"}, ("colocated", "colocated")),
    ("pd-prefill", "prefill-http", 9103, {"app": "llama-8b-pd", "llm-d.ai/role": "prefill"},
     ("pd", "prefill")),
    ("pd-decode", "http", 9104, {"app": "llama-8b-pd", "llm-d.ai/role": "decode"}, ("pd", "decode")),
    # the decode pod's routing sidecar: another port of the same pod, not vLLM
    ("pd-decode", "sidecar-http", 9105, {"app": "llama-8b-pd", "llm-d.ai/role": "decode"}, None),
    # a P/D pod that says no role, or serves both phases: never summed into the prefill or decode role
    ("pd-norole", "http", 9106, {"app": "llama-8b-pd"}, None),
    ("pd-both", "http", 9107, {"app": "llama-8b-pd", "llm-d.ai/role": "prefill-decode"}, None),
    ("redis", "http", 9108, {"app": "redis"}, None),
]


def file_sd_group(pod: str, port_name: str, port: int, labels: dict[str, str]) -> dict[str, Any]:
    meta = {POD_NAMESPACE: SPEC.kubernetes.namespace, POD_NAME: pod, CONTAINER_PORT_NAME: port_name}
    for key, value in labels.items():
        meta[pod_label(key)] = value
        meta[pod_label_present(key)] = "true"
    return {"targets": [f"127.0.0.1:{port}"], "labels": meta}


def prometheus_config(tmp_path: Path, groups: list[dict[str, Any]]) -> Path:
    """The generated kubernetes_sd jobs with the pods given through file_sd instead."""
    (tmp_path / "pods.json").write_text(json.dumps(groups))
    jobs = []
    for job in kubernetes_sd_jobs(SPEC):
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod", "namespaces": {"names": ["llm-d"]}}]
        jobs.append({**job, "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}]})
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "500ms"},
                                      "scrape_configs": jobs}))
    return config


def test_pods_labelled_as_llm_d_labels_them_get_the_rules_labels(tmp_path: Path) -> None:
    groups = [file_sd_group(pod, port_name, port, labels) for pod, port_name, port, labels, _ in PODS]
    with running_prometheus(prometheus_config(tmp_path, groups)) as prometheus:
        def settled() -> Any:
            data = prometheus.get_json("/api/v1/targets")["data"]
            seen = len(data["activeTargets"]) + len(data["droppedTargets"])
            return data if seen == len(PODS) * len(SPEC.topologies) else None  # each job sees each pod

        body = {"status": "success", "data": wait_for(settled, 60, "every pod discovered by both jobs")}
    active = {t["labels"]["replica"]: t["labels"] for t in body["data"]["activeTargets"]}
    expected = {pod: {"instance": f"127.0.0.1:{port}", "job": "vllm", "topology": want[0], "role": want[1],
                      "gpus": "1", "replica": pod}
                for pod, _, port, _, want in PODS if want is not None}
    # Exactly these labels: the __meta_* labels are gone, nothing else was added, no pod kept twice.
    assert active == expected
    assert len(body["data"]["activeTargets"]) == len(expected)

    # The exporter's discovery reads the same answer and maps each pod the same way, and says why
    # the P/D pods it cannot use are left out, naming the pod and the label.
    targets, problems = pod_targets(SPEC, discovered_pods(body, SPEC.kubernetes.path))
    assert {t.instance: (t.topology, t.role, t.gpus, t.metrics_url) for t in targets} == {
        pod: (labels["topology"], labels["role"], 1, f"http://{labels['instance']}/metrics")
        for pod, labels in expected.items()}
    assert sorted(problems) == [
        "pod llm-d/pd-both of P/D topology pd: label llm-d.ai/role='prefill-decode' is not prefill or decode "
        "(map it with kubernetes.role_values)",
        "pod llm-d/pd-norole of P/D topology pd has no label llm-d.ai/role (prefill or decode)"]


def test_the_operator_resources_carry_the_same_relabelling() -> None:
    """PodMonitor and ServiceMonitor say what the plain job says, in the Operator's spelling (the
    plain job adds only its container-port filter, which the monitors express as endpoint ports)."""
    from crossover.rules.generate import Format, outputs
    from crossover.rules.model import build_rules

    files = outputs(SPEC, build_rules(SPEC), Format.OPERATOR, "k8s", "k8s")
    plain = {job["job_name"]: job["relabel_configs"][1:] for job in kubernetes_sd_jobs(SPEC)}
    names = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    for file, endpoints in (("podmonitor.yaml", "podMetricsEndpoints"), ("servicemonitor.yaml", "endpoints")):
        monitors = list(yaml.safe_load_all(files[file]))
        assert len(monitors) == len(SPEC.topologies)
        for monitor, topology in zip(monitors, SPEC.topologies, strict=True):
            assert [e["port"] for e in monitor["spec"][endpoints]] == SPEC.kubernetes.ports
            for endpoint in monitor["spec"][endpoints]:
                spelled = [{names.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]
                assert spelled == plain[f"vllm-{topology.name}"]
