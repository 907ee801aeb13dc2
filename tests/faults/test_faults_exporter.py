"""The exporter under faults, against the simulated fleet plus a loopback server of bad targets:
a target down, slow beyond the timeout, answering 5xx, non-text or HTML, malformed or truncated;
a counter reset (restart) and renamed (legacy) metric names.

For each fault: crossover_target_up is 0 with the right crossover_scrape_errors_total{reason}, the
other targets keep being scraped every interval, the fault's data stays out of the derivations
(a topology's figures are those of its healthy members), and the target comes back when healed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from crossover.exporter.service import Exporter, running_exporter
from crossover.netutil import free_port
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.spec import Fault, FleetSpec
from tests.faults.faults_exporter import (
    HEALTHY_PAYLOAD,
    errors,
    fleet_spec,
    group,
    samples,
    send_requests,
    simulated_part,
    snapshot,
    up,
)
from tests.faults.faults_servers import serving
from tests.helpers import wait_for

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

# bad target name -> (what its /metrics does, the reason the exporter must count)
BAD = {
    "bad-500": ("status 500", "http_status"),
    "bad-503": ("status 503", "http_status"),
    "bad-binary": ("bytes that are not UTF-8", "parse"),
    "bad-html": ("an HTML error page with status 200", "parse"),
    "bad-slow": ("an answer after 3 s (timeout is 0.5 s)", "timeout"),
}


@dataclass
class BadTargets:
    healthy: set[str] = field(default_factory=set)  # names that serve a real vLLM payload now

    def handler(self, name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def metrics(request: web.Request) -> web.StreamResponse:
            if name in self.healthy:
                return web.Response(body=HEALTHY_PAYLOAD, content_type="text/plain")
            if name == "bad-500":
                return web.Response(status=500, text="internal error")
            if name == "bad-503":
                return web.Response(status=503, text="unavailable", headers={"Retry-After": "1"})
            if name == "bad-binary":
                return web.Response(body=b"\xff\xfe\x00\x81" * 256, content_type="text/plain")
            if name == "bad-html":
                return web.Response(text="<html><body><h1>Bad Gateway</h1></body></html>\n",
                                    content_type="text/html")
            await asyncio.sleep(3)
            return web.Response(body=HEALTHY_PAYLOAD, content_type="text/plain")
        return metrics


@dataclass
class Stack:
    fleet: SimFleet
    spec: FleetSpec
    url: str
    bad: BadTargets


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    bad = BadTargets()
    routes = {("GET", f"/{name}/metrics"): bad.handler(name) for name in BAD}
    with serving(routes) as server:
        urls = {name: f"{server.url}/{name}" for name in BAD}
        urls["bad-down"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        spec = fleet_spec(urls)
        with running_fleet(simulated_part(spec)) as fleet, running_exporter(Exporter(spec)) as url:
            yield Stack(fleet, spec, url, bad)


def test_every_bad_target_is_down_with_its_reason_and_recovers(stack: Stack) -> None:
    expected = {**{name: reason for name, (_, reason) in BAD.items()}, "bad-down": "connection"}
    wait_for(lambda: all(errors(samples(stack.url), n, r) >= 2 for n, r in expected.items()), 30,
             "every bad target counted twice")
    rows = samples(stack.url)
    for name, reason in expected.items():
        assert up(rows, name) == 0.0, name
        # (a timeout is tolerated: on a saturated machine even a quick answer can miss 0.5 s)
        others = [(lab["reason"], v) for n, lab, v in rows if n == "crossover_scrape_errors_total"
                  and lab["instance"] == name and lab["reason"] not in (reason, "timeout") and v > 0]
        assert not others, (name, others)
    wait_for(lambda: all(up(samples(stack.url), n) == 1.0 for n in ("tp4-0", "tp2-0", "tp2-1")), 15,
             "the simulated targets up beside the bad ones")
    # nothing of the bad topology enters a derivation
    document = snapshot(stack.url)
    assert group(document, "bad")["targets"] == 0
    assert group(document, "bad")["generation_tokens_per_second"] is None
    # the cycle did not wait for the slow target's 3 s answer: its timeout (0.5 s) cut it short
    assert document["cycle_seconds"] < 3.0
    # healed targets come back up and their data enters the topology again
    stack.bad.healthy.update(BAD)
    wait_for(lambda: all(up(samples(stack.url), n) == 1.0 for n in BAD), 30, "healed targets up")
    wait_for(lambda: group(snapshot(stack.url), "bad")["targets"] == len(BAD), 15,
             "healed targets in the bad topology's window")
    rows = samples(stack.url)
    assert up(rows, "bad-down") == 0.0


def _scrapes(url: str) -> dict[str, float]:
    return {lab["instance"]: v for n, lab, v in samples(url) if n == "crossover_scrapes_total"}


def test_stalled_and_malformed_targets_stay_out_of_the_topology(stack: Stack) -> None:
    fleet, spec, url = stack.fleet, stack.spec, stack.url
    started, scrapes_before = time.monotonic(), _scrapes(url)
    fleet.set_fault("tp2-0", Fault(stall_metrics=True))
    try:
        before = errors(samples(url), "tp2-0", "timeout")
        wait_for(lambda: errors(samples(url), "tp2-0", "timeout") >= before + 2, 15, "tp2-0 timing out")
        # its last good scrapes age out of the 6 s window; from then on only tp2-1 makes up tp2x2
        wait_for(lambda: group(snapshot(url), "tp2x2")["targets"] == 1, 15, "tp2-0 out of the window")
        tp2 = [i.url for i in spec.topology("tp2x2").instances]
        assert send_requests(tp2, spec.model.name, 8) == 8  # traffic to both instances of tp2x2
        wait_for(lambda: (group(snapshot(url), "tp2x2", "tp2-1")["latency"].get("e2el") or {})
                 .get("observations", 0) >= 4, 15, "tp2-1's requests in the window")
        document = snapshot(url)
        topology, healthy = group(document, "tp2x2"), group(document, "tp2x2", "tp2-1")
        assert topology["targets"] == 1 and group(document, "tp2x2", "tp2-0")["targets"] == 0
        assert topology["latency"]["e2el"]["observations"] == healthy["latency"]["e2el"]["observations"]
        assert topology["generation_tokens_per_second"] == pytest.approx(
            healthy["generation_tokens_per_second"])
        # the healthy targets kept being scraped (one a second, loosely: the machine is shared) while
        # tp2-0 hung for up to 600 s on every scrape
        elapsed, scrapes_after = time.monotonic() - started, _scrapes(url)
        assert scrapes_after["tp4-0"] - scrapes_before["tp4-0"] >= 0.3 * elapsed, (elapsed, scrapes_after)
        fleet.set_fault("tp2-0", Fault(malformed_metrics=True))
        before = errors(samples(url), "tp2-0", "parse")
        wait_for(lambda: errors(samples(url), "tp2-0", "parse") >= before + 2, 15, "tp2-0 malformed")
        assert up(samples(url), "tp2-0") == 0.0
        fleet.set_fault("tp2-0", Fault(truncated_metrics=True))
        rows = samples(url)
        broken = errors(rows, "tp2-0", "read") + errors(rows, "tp2-0", "parse")
        wait_for(lambda: errors(samples(url), "tp2-0", "read") + errors(samples(url), "tp2-0", "parse")
                 >= broken + 2, 15, "tp2-0 truncated")
        assert up(samples(url), "tp2-0") == 0.0
    finally:
        fleet.set_fault("tp2-0", Fault())
    wait_for(lambda: up(samples(url), "tp2-0") == 1.0, 15, "tp2-0 back up")
    wait_for(lambda: group(snapshot(url), "tp2x2")["targets"] == 2, 15, "tp2-0 back in the topology")


def test_a_counter_reset_counts_from_zero_never_negative(stack: Stack) -> None:
    fleet, spec, url = stack.fleet, stack.spec, stack.url
    instance = spec.topology("tp4x1").instances[0]
    assert send_requests([instance.url], spec.model.name, 6) == 6
    wait_for(lambda: (group(snapshot(url), "tp4x1")["latency"].get("e2el") or {}).get("observations") == 6,
             15, "the first burst in the window")
    # let the window (6 s) pass without traffic: the counters stand still at their high values
    wait_for(lambda: group(snapshot(url), "tp4x1")["latency"]["e2el"]["observations"] == 0, 15,
             "a quiet window")
    fleet.restart("tp4-0")  # counters back to zero, as after a process restart
    assert send_requests([instance.url], spec.model.name, 3) == 3
    sent = time.monotonic()
    # Inside one window: the old high values, then zero, then the new requests. Every reading must
    # lie in 0..3, and 3 must show while the pre-restart scrapes are still in the window (a naive
    # difference would read 3 - 6 there and only reach 3 once they aged out).
    seen: list[float] = []
    while not seen or seen[-1] != 3:
        figures = group(snapshot(url), "tp4x1")
        seen.append(figures["latency"]["e2el"]["observations"])
        assert figures["generation_tokens_per_second"] >= 0 and figures["requests_per_second"] >= 0
        assert time.monotonic() - sent < 5.5, f"3 observations not reached within the window: {seen}"
        time.sleep(0.1)
    assert all(0 <= v <= 3 for v in seen), seen
    figures = group(snapshot(url), "tp4x1")
    assert figures["generation_tokens_per_second"] > 0
    assert figures["requests_per_second"] > 0
    assert up(samples(url), "tp4-0") == 1.0


def test_legacy_metric_names_keep_the_derivations_alive(stack: Stack) -> None:
    fleet, spec, url = stack.fleet, stack.spec, stack.url
    def broken() -> float:  # tp2-1's errors other than timeouts (a loaded machine may cause those)
        return sum(v for n, lab, v in samples(url) if n == "crossover_scrape_errors_total"
                   and lab["instance"] == "tp2-1" and lab["reason"] != "timeout")

    before = broken()
    fleet.set_fault("tp2-1", Fault(legacy_names=True))
    try:
        assert send_requests([spec.topology("tp2x2").instances[1].url], spec.model.name, 4) == 4
        wait_for(lambda: ((group(snapshot(url), "tp2x2", "tp2-1")["latency"].get("itl") or {})
                          .get("observations") or 0) > 0, 15, "ITL through the legacy name")
        figures = group(snapshot(url), "tp2x2", "tp2-1")
        assert figures["kv_cache_usage_max"] is not None  # gpu_cache_usage_perc, the old name
        assert figures["generation_tokens_per_second"] > 0
        wait_for(lambda: up(samples(url), "tp2-1") == 1.0, 15, "tp2-1 up with legacy names")
        assert broken() == before
    finally:
        fleet.set_fault("tp2-1", Fault())
