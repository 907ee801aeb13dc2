"""Live: the exporter takes a Kubernetes fleet's pods from a real Prometheus's target discovery
(/api/v1/targets) and follows them as they come and go, without a restart. The pods are file_sd
targets pointing at simulated vLLM instances (`crossover sim`), carrying the `__meta_kubernetes_*`
labels Kubernetes discovery would give pods labelled as llm-d labels them; Prometheus scrapes them
with a plain job of the user's (no relabelling of ours): the exporter maps them itself."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from crossover.exporter.service import Exporter, running_exporter
from crossover.exporter.targets import PrometheusSd
from crossover.kube import CONTAINER_PORT_NAME, POD_NAME, POD_NAMESPACE, pod_label, pod_label_present
from crossover.netutil import free_port, spec_on_free_ports
from crossover.rules.prom import running_prometheus
from crossover.sim import fleet as sim_fleet
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS, wait_for

pytestmark = pytest.mark.timeout(180)


def kubernetes_spec(sim: FleetSpec) -> FleetSpec:
    """The simulated fleet as a Kubernetes user's spec: selector topologies, roles from llm-d.ai/role."""
    data = sim.model_dump(mode="json", exclude={"simulator"})
    pd = sim.topology("pd1p1d")
    data["topologies"] = [
        {"name": "colocated", "tensor_parallel_size": 1, "selector": {"app": "colo"}},
        {"name": "pd1p1d", "tensor_parallel_size": 1, "selector": {"app": "pd"}, "pd": True,
         "entrypoint": pd.entrypoint.model_dump(mode="json", exclude_none=True)},
    ]
    data["kubernetes"] = {"namespace": "default", "topology_label": None, "role_label": "llm-d.ai/role"}
    return FleetSpec.model_validate(data)


def pods(sim: FleetSpec, leave_out: str = "") -> list[dict[str, Any]]:
    groups = []
    for topology in sim.topologies:
        for instance in topology.instances:
            if instance.name == leave_out:
                continue
            labels = {"app": "colo" if topology.name == "colocated" else "pd"}
            if topology.disaggregated:
                labels["llm-d.ai/role"] = instance.role.value
            meta = {POD_NAMESPACE: "default", POD_NAME: instance.name, CONTAINER_PORT_NAME: "http"}
            for key, value in labels.items():
                meta[pod_label(key)], meta[pod_label_present(key)] = value, "true"
            groups.append({"targets": [instance.url.removeprefix("http://")], "labels": meta})
    return groups


def scraped(url: str) -> dict[str, tuple[str, str, float]]:
    """instance -> (topology, role, up) of the exporter's crossover_target_up."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return {s.labels["instance"]: (s.labels["topology"], s.labels["role"], s.value)
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name == "crossover_target_up"}


@pytest.mark.prometheus
@pytest.mark.slow
def test_exporter_follows_the_pods_prometheus_discovers(tmp_path: Path) -> None:
    sim = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    spec = kubernetes_spec(sim)
    pods_file = tmp_path / "pods.json"
    pods_file.write_text(json.dumps(pods(sim)))
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "scrape_timeout": "500ms"},
        "scrape_configs": [{"job_name": "kubernetes-pods",
                            "file_sd_configs": [{"files": [str(pods_file)]}]}]}))
    everyone = {"colo-0": ("colocated", "colocated", 1.0), "colo-1": ("colocated", "colocated", 1.0),
                "prefill-0": ("pd1p1d", "prefill", 1.0), "decode-0": ("pd1p1d", "decode", 1.0),
                "pd1p1d-entrypoint": ("pd1p1d", "entrypoint", 1.0)}
    with sim_fleet.running_fleet(sim), running_prometheus(config) as prometheus:
        exporter = Exporter(spec, prometheus_sd_url=prometheus.url)
        assert exporter.prometheus_sd is not None
        exporter.prometheus_sd.every_s = 0.5  # follow the test's changes quickly
        # Before discovery, only the spec's own target (the P/D proxy's metrics) is known.
        assert [t.instance for t in exporter.targets] == ["pd1p1d-entrypoint"]
        with running_exporter(exporter) as url:
            wait_for(lambda: scraped(url) == everyone, 60, "every discovered pod scraped and up")
            # A pod goes away (scaled down): Prometheus stops discovering it, the exporter follows.
            pods_file.write_text(json.dumps(pods(sim, leave_out="colo-1")))
            fewer = {k: v for k, v in everyone.items() if k != "colo-1"}
            wait_for(lambda: scraped(url) == fewer, 60, "colo-1 gone after it left the discovery")
            # ... and comes back.
            pods_file.write_text(json.dumps(pods(sim)))
            wait_for(lambda: scraped(url) == everyone, 60, "colo-1 back after it was discovered again")
            assert {t.instance: t.gpus for t in exporter.targets} == {
                "colo-0": 1, "colo-1": 1, "prefill-0": 1, "decode-0": 1, "pd1p1d-entrypoint": 0}


def test_an_unreachable_prometheus_keeps_the_pods_and_is_said_once() -> None:
    sim = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    spec = kubernetes_spec(sim)
    discovery = PrometheusSd(f"http://127.0.0.1:{free_port()}", timeout_s=5)

    async def twice() -> tuple[list[str], list[str]]:
        async with aiohttp.ClientSession() as session:
            return (await discovery.refresh(session, spec, 0.0),
                    await discovery.refresh(session, spec, 100.0))

    first, second = asyncio.run(twice())
    assert len(first) == 1 and first[0].startswith(f"{discovery.url}/api/v1/targets: ")
    assert first[0].endswith("(keeping the 0 pods found before)")
    assert second == [] and discovery.targets() == []
