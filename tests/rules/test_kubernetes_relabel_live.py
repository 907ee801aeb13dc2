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
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover import catalog
from crossover.exporter.targets import discovered_pods
from crossover.kube import (
    CONTAINER_PORT_NAME,
    POD_NAME,
    POD_NAMESPACE,
    pod_label,
    pod_label_present,
    pod_targets,
)
from crossover.pdproxy.proxy import ERROR, EntrypointMetrics
from crossover.rules.prom import running_prometheus
from crossover.rules.render import kubernetes_sd_jobs
from crossover.spec import ENTRYPOINT_ROLE, Target, load_spec
from tests.helpers import SPECS, serving_http, wait_for

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
            # each job (a topology's pods, a router's) sees each pod
            return data if seen == len(PODS) * len(kubernetes_sd_jobs(SPEC)) else None

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
    metric = {job["job_name"]: job["metric_relabel_configs"] for job in kubernetes_sd_jobs(SPEC)
              if "metric_relabel_configs" in job}

    def spelled(relabels: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{names.get(k, k): v for k, v in r.items()} for r in relabels]

    for file, endpoints in (("podmonitor.yaml", "podMetricsEndpoints"), ("servicemonitor.yaml", "endpoints")):
        monitors = list(yaml.safe_load_all(files[file]))
        engines = monitors[:len(SPEC.topologies)]
        for monitor, topology in zip(engines, SPEC.topologies, strict=True):
            assert [e["port"] for e in monitor["spec"][endpoints]] == SPEC.kubernetes.ports
            for endpoint in monitor["spec"][endpoints]:
                assert spelled(endpoint["relabelings"]) == plain[f"vllm-{topology.name}"]
                assert "metricRelabelings" not in endpoint  # the engines' series are vLLM's own
        # The routers: one PodMonitor each (llm-d's Service carries other labels than its pods, so
        # no ServiceMonitor), relabelled and metric-relabelled exactly as the plain job.
        routers = monitors[len(SPEC.topologies):]
        assert len(routers) == (len(SPEC.topologies) if file == "podmonitor.yaml" else 0)
        for monitor, topology in zip(routers, SPEC.topologies if routers else [], strict=True):
            assert monitor["spec"]["selector"] == {"matchLabels": topology.entrypoint.selector}
            (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
            assert endpoint["port"] == "metrics"
            job = f"vllm-{topology.name}-entrypoint"
            assert spelled(endpoint["relabelings"]) == plain[job]
            assert spelled(endpoint["metricRelabelings"]) == metric[job]
            assert any(r.get("target_label") == "__name__" and r.get("replacement") ==
                       catalog.TTFT.name + "_${1}" for r in metric[job])


def test_llm_d_routers_pods_are_the_topologys_entrypoint_read_in_vllms_families(tmp_path: Path) -> None:
    """The endpoint picker's pods, found by the label llm-d's chart gives them, on its `metrics` port:
    scraped as the topology's entrypoint, their llm_d_epp_ series turned into vLLM's entrypoint
    families by the generated job's metric relabelling (the rules, alerts and dashboards read those),
    and the exporter's discovery takes the same pod as the entrypoint, read in llm-d's dialect."""
    router = EntrypointMetrics(SPEC.model.name, catalog.LLMD_DIALECT.name)
    for _ in range(4):
        router.arrived()
    for start in (0.0, 1.0, 2.0):  # three streamed answers: TTFT 0.2 s each
        router.finished("stop", start, start + 0.5, [start + 0.2, start + 0.3, start + 0.4])
    router.finished(ERROR, 3.0, 3.1, [])  # an instance failed it (ModelServerError)
    router.refused(400)  # bad input: the client's own mistake, never routed
    router.finished("stop", 4.0, 4.7, [], streamed=False)  # not streamed: no TTFT (llm-d's streaming="false")
    router.arrived()
    body = router.render()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    epp = {"llm-d-router-gateway": "llama-8b-pd-epp", "llm-d.ai/igw-mode": "llm-d-router-gateway"}
    with serving_http(Handler) as address:
        port = int(address.rsplit(":", 1)[1])
        groups = [file_sd_group("pd-epp-0", "metrics", port, epp),
                  file_sd_group("pd-epp-0", "grpc", 9102, epp),  # its ext-proc port: not metrics
                  # another pool's router: the colocated topology's entrypoint, nothing served here
                  file_sd_group("plain-epp-0", "metrics", 9103, {"llm-d-router-gateway": "llama-8b-epp"})]
        with running_prometheus(prometheus_config(tmp_path, groups)) as prometheus:
            where = '{topology="pd",role="entrypoint"}'
            success = catalog.REQUEST_SUCCESS.promql_name

            def scraped() -> Any:
                return prometheus.query(f"{success}{where}") or None

            wait_for(scraped, 60, "the router pod scraped")
            targets = prometheus.get_json("/api/v1/targets")
            active = {t["labels"]["replica"]: t["labels"] for t in targets["data"]["activeTargets"]}
            assert active == {  # the grpc port is not scraped; each router is its own topology's
                "pd-epp-0": {"instance": address, "job": "vllm", "topology": "pd", "role": ENTRYPOINT_ROLE,
                             "gpus": "0", "replica": "pd-epp-0"},
                "plain-epp-0": {"instance": "127.0.0.1:9103", "job": "vllm", "topology": "colocated",
                                "role": ENTRYPOINT_ROLE, "gpus": "0", "replica": "plain-epp-0"}}

            def total(expr: str) -> float:
                return sum(s.value for s in prometheus.query(f"sum({expr})"))

            # Routed 5: 3 streamed, 1 unstreamed, 1 failed by the instance; the 400 never routed.
            assert total(f'{success}{{topology="pd",finished_reason="routed"}}') == 5
            assert total(f'{success}{{topology="pd",finished_reason="error"}}') == 1
            # BadRequest is the client's own mistake: dropped
            assert prometheus.query(f'{catalog.ADMISSION_REJECTIONS.promql_name}{{topology="pd"}}') == []
            # TTFT of streamed answers only, in vLLM's name; llm-d's own TTFT series are gone.
            assert total(f"{catalog.TTFT.name}_count{where}") == 3
            assert abs(total(f"{catalog.TTFT.name}_sum{where}") - 0.6) < 1e-9
            assert total(f"{catalog.ITL.name}_count{where}") == 6
            own = "llm_d_epp_request_(ttft|streaming_itl)_seconds_(bucket|sum|count)"
            assert prometheus.query(f'{{__name__=~"{own}"}}') == []
            # The filter's mark never stays on a stored series.
            marked = prometheus.get_json("/api/v1/labels")["data"]
            assert not [name for name in marked if name.startswith("__tmp")]

    found, problems = pod_targets(SPEC, discovered_pods(targets, SPEC.kubernetes.path))
    assert problems == []
    assert sorted(found, key=lambda t: t.topology) == [
        Target("colocated", "plain-epp-0", ENTRYPOINT_ROLE, "http://127.0.0.1:9103/metrics", 0, "llm-d"),
        Target("pd", "pd-epp-0", ENTRYPOINT_ROLE, f"http://{address}/metrics", 0, "llm-d")]
