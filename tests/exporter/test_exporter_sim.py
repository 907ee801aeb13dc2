"""The exporter against the simulated fleet: goodput vs client-measured truth, every exported series
on a P/D fleet, and broken targets that never stop the others."""

from __future__ import annotations

import asyncio
import json
import math
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.exporter import names
from crossover.exporter.derive import derive
from crossover.exporter.service import Exporter, running_exporter
from crossover.netutil import free_port, spec_on_free_ports
from crossover.sim import fleet as sim_fleet
from crossover.spec import Fault, FleetSpec, load_spec
from tests.exporter.exporter_traffic import Timed, send, send_sync
from tests.helpers import SPECS, wait_for

pytestmark = pytest.mark.timeout(120)


def with_scrape(spec: FleetSpec, **scrape: Any) -> FleetSpec:
    data = spec.model_dump(mode="json")
    data["scrape"].update(scrape)
    return FleetSpec.model_validate(data)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def client_share(values: list[float], threshold: float) -> float:
    return sum(v <= threshold for v in values) / len(values)


def _middle_boundary(values: list[float], buckets: tuple[float, ...]) -> tuple[float, float, float]:
    """A bucket boundary where the client share is far from 0 and 1 (so a wrong ratio shows), with
    the boundaries below and above it."""
    best = min(range(1, len(buckets) - 1), key=lambda i: abs(client_share(values, buckets[i]) - 0.5))
    return buckets[best - 1], buckets[best], buckets[best + 1]


@pytest.mark.slow
def test_goodput_matches_client_measured_truth():
    # A tenth of real speed: latencies in the 50 ms-1 s range, where the client's own loopback and
    # event-loop overhead on a busy 2-core machine stays well inside one bucket.
    spec = sim_fleet.with_overrides(spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")),
                                    time_scale=0.1)
    with sim_fleet.running_fleet(spec):
        async def scenario() -> tuple[Exporter, dict[str, list[Timed]], float]:
            exporter = Exporter(spec)
            async with aiohttp.ClientSession() as session:
                start = time.time()
                await exporter.cycle(session, now=start)  # every counter still at zero
                timed = {}
                for topology in spec.topologies:
                    urls = [i.url for i in topology.instances]
                    timed[topology.name] = await send(urls, spec.model.name, 32, concurrency=8)
                await exporter.cycle(session, now=start + 30.0)
            return exporter, timed, start + 30.0

        exporter, timed, end = asyncio.run(scenario())

    for topology in spec.topologies:
        client = timed[topology.name]
        windows = [h.history.window(end, 60.0) for h in exporter.health.values()
                   if h.target.topology == topology.name]
        ttft_below, ttft_slo, ttft_above = _middle_boundary([t.ttft for t in client], catalog.TTFT.buckets)
        tpot_below, tpot_slo, tpot_above = _middle_boundary([t.tpot for t in client], catalog.TPOT.buckets)
        derived = derive(windows, gpus=topology.gpus, window_seconds=60.0,
                         slos_seconds={"ttft": ttft_slo, "tpot": tpot_slo})
        assert derived.latency["ttft"].observations == len(client)
        for slo, below, threshold, above, values in (
                ("ttft", ttft_below, ttft_slo, ttft_above, [t.ttft for t in client]),
                ("tpot", tpot_below, tpot_slo, tpot_above, [t.tpot for t in client])):
            server = derived.attainment[slo]
            assert server.exact
            # The client's timings differ from the server's by loopback and event-loop delays (a
            # late first chunk makes TTFT longer and TPOT shorter): within one bucket either way,
            # the client's shares bracket the server's (2 requests of slack on a busy machine).
            slack = 2 / len(values)
            assert client_share(values, below) - slack <= server.ratio, (slo, threshold)
            assert server.ratio <= client_share(values, above) + slack, (slo, threshold)
            assert 0.0 < server.ratio < 1.0 or client_share(values, threshold) in (0.0, 1.0)
        tokens = sum(t.tokens for t in client)
        assert derived.generation_tokens_per_second == pytest.approx(tokens / 30.0)
        assert derived.requests_per_second_by_reason["length"] == pytest.approx(len(client) / 30.0)
        lower, upper = derived.attainment_lower, derived.attainment_upper
        assert lower is not None and upper is not None
        client_joint = sum(t.ttft <= ttft_slo and t.tpot <= tpot_slo for t in client) / len(client)
        ttft_ratio, tpot_ratio = derived.attainment["ttft"].ratio, derived.attainment["tpot"].ratio
        assert lower == pytest.approx(max(0.0, ttft_ratio + tpot_ratio - 1)) and lower <= upper
        assert upper == min(ttft_ratio, tpot_ratio)
        # The server's shares are at least the client's (it does not see the client's overhead),
        # so the upper bound holds the client's joint share.
        assert client_joint <= upper + 2 / len(client)
        assert derived.goodput_tokens_per_second_lower == pytest.approx(tokens / 30.0 * lower)


@pytest.fixture(scope="module")
def pd_fleet() -> Iterator[tuple[FleetSpec, Any, str]]:
    """The P/D seed fleet with an exporter scraping it every second (windows 1m and 5m)."""
    spec = with_scrape(spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml")), interval="1s",
                       timeout="500ms")
    with sim_fleet.running_fleet(spec) as fleet, running_exporter(Exporter(spec)) as url:
        yield spec, fleet, url


def test_pd_fleet_exports_every_documented_series(pd_fleet):
    spec, _fleet, url = pd_fleet
    for topology in spec.topologies:
        target = [topology.entrypoint.url] if topology.entrypoint.url else [i.url for i in topology.instances]
        send_sync(target, spec.model.name, 12, concurrency=4, prompt_tokens=(256, 1024), max_tokens=8)

    def all_there() -> bool:
        exposed = {name for name, _, _ in samples(get(url + "/metrics"))}
        return exposed >= names.EXPORTED_NAMES

    def all_scraped() -> bool:
        # A scrape may time out on a loaded machine: wait until the last requests have been seen.
        pd = json.loads(get(url + "/api/v1/snapshot"))["topologies"][1]
        return bool(pd["windows"]["1m"]["latency"]["ttft"]["observations"] == 12)

    wait_for(all_there, 20, "every documented series exported")
    wait_for(all_scraped, 20, "the P/D topology's 12 requests scraped")
    text = get(url + "/metrics")
    rows = samples(text)
    exposed = {name for name, _, _ in rows}
    assert exposed <= names.EXPORTED_NAMES, exposed - names.EXPORTED_NAMES
    decode = [v for n, labels, v in rows if n == "crossover_role_kv_transfer_seconds"
              and labels["role"] == "decode" and labels["window"] == "1m" and labels["quantile"] == "0.99"]
    assert decode and all(math.isfinite(v) and v > 0 for v in decode)
    # NIXL families exist on the P/D instances only: absent on colocated ones, never zero.
    assert not [1 for n, labels, _ in rows if n.startswith("crossover_instance_kv_transfer")
                and labels["topology"] == "colocated"]
    document = json.loads(get(url + "/api/v1/snapshot"))
    assert [t["name"] for t in document["topologies"]] == ["colocated", "pd1p1d"]
    pd = document["topologies"][1]
    assert {r["role"] for r in pd["roles"]} == {"prefill", "decode", "entrypoint"}
    # Each request is one request on the prefill instance (max_tokens 1), one on the decode instance
    # and one at the entrypoint: the topology counts it once, from the entrypoint; each role holds 12.
    assert pd["requests_source"] == "entrypoint"
    assert pd["windows"]["1m"]["latency"]["ttft"]["observations"] == 12
    assert [r["windows"]["1m"]["latency"]["ttft"]["observations"] for r in pd["roles"]] == [12, 12, 12]
    assert pd["output_tps"] and pd["output_tps"] > 0


def _target_row(rows: list, name: str, instance: str, **extra: str) -> float:
    found = [v for n, labels, v in rows if n == name and labels.get("instance") == instance
             and all(labels.get(k) == val for k, val in extra.items())]
    assert len(found) == 1, (name, instance, extra, found)
    return found[0]


def test_broken_targets_never_stop_the_others(tmp_path: Path):
    spec = with_scrape(spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")), interval="1s",
                       timeout="500ms")
    closed_port = free_port()
    sim_port = int(spec.topologies[0].instances[0].url.rsplit(":", 1)[1])
    file_sd = tmp_path / "targets.json"
    file_sd.write_text(json.dumps([
        {"targets": [f"127.0.0.1:{closed_port}"], "labels": {"topology": "tp2x2", "instance": "gone"}},
        {"targets": [f"127.0.0.1:{sim_port}"],
         "labels": {"topology": "tp2x2", "instance": "wrong-path", "__metrics_path__": "/nope"}},
    ]))
    with sim_fleet.running_fleet(spec) as fleet:
        fleet.set_fault("tp4-0", Fault(stall_metrics=True))
        fleet.set_fault("tp2-0", Fault(malformed_metrics=True))
        fleet.set_fault("tp2-1", Fault(truncated_metrics=True))
        exporter = Exporter(spec, file_sd_paths=[str(file_sd)])
        try:
            with running_exporter(exporter) as url:
                def counted() -> bool:
                    rows = samples(get(url + "/metrics"))
                    errors = [v for n, _, v in rows if n == "crossover_scrape_errors_total"]
                    return sum(v > 0 for v in errors) >= 5
                wait_for(counted, 20, "scrape errors counted for five targets")
                rows = samples(get(url + "/metrics"))
                for instance, reason in (("tp4-0", "timeout"), ("tp2-0", "parse"), ("gone", "connection"),
                                         ("wrong-path", "http_status")):
                    assert _target_row(rows, "crossover_target_up", instance) == 0.0, instance
                    assert _target_row(rows, "crossover_scrape_errors_total", instance, reason=reason) >= 1
                assert _target_row(rows, "crossover_target_up", "tp2-1") == 0.0
                truncated = sum(_target_row(rows, "crossover_scrape_errors_total", "tp2-1", reason=r)
                                for r in ("read", "parse"))
                assert truncated >= 1
                # A target healing comes back up; one slow target did not delay the others' cycle.
                fleet.set_fault("tp2-0", Fault())
                wait_for(lambda: _target_row(samples(get(url + "/metrics")), "crossover_target_up",
                                             "tp2-0") == 1.0, 20, "the healed tp2-0 up")
                cycle = [v for n, _, v in samples(get(url + "/metrics"))
                         if n == "crossover_exporter_cycle_seconds"]
                assert cycle and cycle[0] < 0.9
        finally:
            fleet.clear_faults()
