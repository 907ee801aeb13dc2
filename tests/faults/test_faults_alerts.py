"""Alerts end to end: the simulated fleet, a real Prometheus with the rules `crossover rules`
generates (a test SLO profile: --window-scale shrinks the 30-day period and every burn window), a
real Alertmanager with the compose stack's configuration (compose/alertmanager/alertmanager.yml, its
webhook URL pointed at a receiver in this test, nothing else changed), all on loopback.

Steady traffic runs on both topologies; one instance of tp2x2 gets a simulator fault: slow decode
(the goodput burn-rate alert for tp2x2's TPOT SLO fires), or engine errors on half its requests with
latency within every SLO (failed requests count as not good, crossover.slo: the alert fires on
errors alone). The alert reaches the receiver; the fault is switched off through the simulator's
admin API: the alert resolves and the receiver gets status "resolved". The healthy topology (tp4x1)
never burns: an alert that fires for everything would fail this test.

The shipped timings are the ones users get, so the waits include them: a notification may wait the
longest group_wait of its route, a resolution the next group_interval of its group.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from crossover import slo
from crossover.cli import main as crossover_main
from crossover.netutil import free_port, spec_on_free_ports
from crossover.rules.names import BURN_ALERT
from crossover.sim.fleet import running_fleet
from crossover.spec import Fault, FleetSpec, load_spec
from tests.faults.faults_servers import serving
from tests.faults.faults_stack import (
    SHIPPED_ALERTMANAGER,
    longest,
    running_alertmanager,
    running_prometheus,
    shipped_alertmanager_config,
)
from tests.helpers import SPECS
from tests.sim.sim_client import post_json

ROUTE = yaml.safe_load(SHIPPED_ALERTMANAGER.read_text())["route"]
GROUP_WAIT_S, GROUP_INTERVAL_S = longest(ROUTE, "group_wait"), longest(ROUTE, "group_interval")

pytestmark = [pytest.mark.prometheus, pytest.mark.slow,
              pytest.mark.timeout(240 + GROUP_WAIT_S + GROUP_INTERVAL_S)]

# 30 days x 0.001 = 43 minutes; the 1h/5m page tier becomes 4 s/4 s (four 1 s scrapes at least).
WINDOW_SCALE = 0.001
SLOWDOWN = 20.0  # TPOT ~6 ms -> ~120 ms against the 50 ms SLO
ALERT = BURN_ALERT


def _fast_spec() -> FleetSpec:
    data = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")).model_dump(mode="json")
    data["scrape"].update({"interval": "1s", "timeout": "1s"})
    return FleetSpec.model_validate(data)


@contextmanager
def steady_traffic(spec: FleetSpec, streams_per_topology: int = 2) -> Iterator[dict[str, int]]:
    """Closed-loop streamed requests to every topology on a background thread until the block ends."""
    done = {t.name: 0 for t in spec.topologies}
    stop = threading.Event()

    async def worker(session: aiohttp.ClientSession, topology: str, urls: list[str], turn: int) -> None:
        while not stop.is_set():
            url = urls[turn % len(urls)]
            turn += 1
            body = {"model": spec.model.name, "prompt": "one two three four five six seven eight",
                    "max_tokens": 16, "ignore_eos": True, "stream": True}
            try:
                async with session.post(url + "/v1/completions", json=body) as response:
                    async for _ in response.content:
                        pass
                    if response.status == 200:
                        done[topology] += 1
            except (aiohttp.ClientError, TimeoutError):
                await asyncio.sleep(0.1)

    async def drive() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            await asyncio.gather(*(worker(session, t.name, [i.url for i in t.instances], k)
                                   for t in spec.topologies for k in range(streams_per_topology)))

    thread = threading.Thread(target=lambda: asyncio.run(drive()), name="faults-traffic", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(40)


def set_fault(spec: FleetSpec, instance: str, fault: Fault) -> None:
    """Switch a fault through the simulator's admin API, as an operator would."""
    url = next(i.url for t in spec.topologies for i in t.instances if i.name == instance)
    status, _ = post_json(url + "/admin/faults", fault.model_dump(), timeout=10)
    assert status == 200


def _burn_alerts(notifications: list[dict[str, Any]], status: str, topology: str) -> list[dict[str, Any]]:
    return [a for n in notifications for a in n.get("alerts", [])
            if a.get("status") == status and a["labels"].get("alertname") == ALERT
            and a["labels"].get("topology") == topology]


def _windows(notifications: list[dict[str, Any]], status: str) -> set[str]:
    return {a["labels"]["long_window"] for a in _burn_alerts(notifications, status, "tp2x2")}


FAULTS = {"slow_decode": Fault(slowdown=SLOWDOWN), "errors": Fault(error_rate=0.5)}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_burn_rate_alert_fires_and_resolves(tmp_path: Path, fault: str) -> None:
    spec = _fast_spec()
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    notifications: list[dict[str, Any]] = []

    async def receive(request: web.Request) -> web.Response:
        notifications.append(await request.json())
        return web.Response(text="ok")

    am_port = free_port()
    rules_dir = tmp_path / "rules"
    assert crossover_main(["rules", str(spec_path), "--out", str(rules_dir), "--window-scale",
                           str(WINDOW_SCALE), "--alertmanager", f"127.0.0.1:{am_port}"]) == 0
    with serving({("POST", "/alerts"): receive}) as webhook:
        am_config = tmp_path / "alertmanager.yml"
        am_config.write_text(shipped_alertmanager_config(webhook.url + "/alerts"))
        with running_fleet(spec), running_alertmanager(am_config, am_port), \
                running_prometheus(rules_dir / "prometheus.yml") as prometheus, steady_traffic(spec) as done:

            def firing() -> list[dict[str, Any]]:
                return [a for a in prometheus.get_json("/api/v1/alerts")["data"]["alerts"]
                        if a["labels"]["alertname"] == ALERT and a["state"] == "firing"]

            def healthy_ratio_recorded() -> bool:
                result = prometheus.get_json("/api/v1/query", {"query": "slo:sli_error:ratio_rate4s"})
                return {s["metric"].get("topology") for s in result["data"]["result"]} >= {"tp4x1", "tp2x2"}

            # a healthy fleet first: every topology's SLI is recorded and nothing burns
            prometheus.wait_until(healthy_ratio_recorded, 60, "SLI error ratios for both topologies")
            time.sleep(5)
            assert not firing(), firing()
            assert not _burn_alerts(notifications, "firing", "tp2x2")

            degraded_at = time.monotonic()
            set_fault(spec, "tp2-0", FAULTS[fault])
            prometheus.wait_until(lambda: bool(_burn_alerts(notifications, "firing", "tp2x2")),
                                  60 + GROUP_WAIT_S, f"{ALERT} for tp2x2 at the webhook")
            fired_after = time.monotonic() - degraded_at
            alert = _burn_alerts(notifications, "firing", "tp2x2")[0]
            # a slow decode misses the TPOT SLO alone; a failed request misses every SLO the spec sets
            assert alert["labels"]["slo"] in (("tpot",) if fault == "slow_decode" else slo.SLO_KINDS), alert
            assert alert["labels"]["severity"] in ("critical", "warning")
            assert alert["annotations"]["runbook_url"].endswith("#vllmgoodputbudgetburn")
            fired_windows = _windows(notifications, "firing")

            restored_at = time.monotonic()
            set_fault(spec, "tp2-0", Fault())

            def resolved() -> bool:
                return fired_windows <= _windows(notifications, "resolved")

            prometheus.wait_until(resolved, 90 + GROUP_INTERVAL_S,
                                  f"resolved {ALERT} for tp2x2 windows {sorted(fired_windows)}")
            resolved_after = time.monotonic() - restored_at
            traffic = dict(done)
    assert not _burn_alerts(notifications, "firing", "tp4x1"), "the healthy topology burned"
    assert min(traffic.values()) > 20, traffic
    print(f"\nburn alert reached the webhook {fired_after:.1f} s after the fault, resolved "
          f"{resolved_after:.1f} s after it was lifted; windows {sorted(fired_windows)}; "
          f"notifications {json.dumps([n['status'] for n in notifications])}")
