"""Live, test SLO profile: with the windows scaled down (`--window-scale`), a fault that slows one
topology makes Prometheus fire the generated goodput burn-rate alert within seconds, for that
topology, while the traffic runs. The same profile serves an end-to-end Alertmanager test."""

from __future__ import annotations

import threading
import time

import pytest

from crossover.rules.model import RulesConfig
from crossover.rules.names import BURN_ALERT
from crossover.spec import Fault
from tests.rules.live_stack import LiveStack, drive, live_stack

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
SCALE = 1 / 2880  # a 30-day SLO period becomes 15 minutes; the 1h/5m page tier becomes seconds


@pytest.fixture(scope="module")
def stack() -> LiveStack:
    return live_stack("seed-70b-h100.yaml", RulesConfig(window_scale=SCALE), warm_up=False)


def test_profile_windows_are_seconds(stack: LiveStack) -> None:
    assert stack.rules.period == "15m"
    assert all(t.long_s <= 90 for t in stack.rules.tiers)


def test_slowed_topology_fires_the_page_within_a_minute(stack: LiveStack) -> None:
    slowed = stack.spec.topology("tp4x1").instances[0].name
    stack.fleet.set_fault(slowed, Fault(slowdown=40.0))
    stop = threading.Event()
    traffic = threading.Thread(target=drive, args=(stack.spec, 60.0, stop), daemon=True)
    traffic.start()
    started = time.monotonic()
    try:
        deadline = time.monotonic() + 90
        firing: list[dict] = []
        while time.monotonic() < deadline and not firing:
            time.sleep(1)
            firing = [a for a in stack.prometheus.alerts()
                      if a["labels"]["alertname"] == BURN_ALERT and a["state"] == "firing"
                      and a["labels"]["topology"] == "tp4x1" and a["labels"]["severity"] == "critical"]
        assert firing, f"no critical burn alert for tp4x1; alerts: {stack.prometheus.alerts()}"
        assert firing[0]["annotations"]["runbook_url"].endswith("#vllmgoodputbudgetburn")
        healthy = [a for a in stack.prometheus.alerts()
                   if a["labels"]["alertname"] == BURN_ALERT
                   and a["labels"]["topology"] == "tp2x2"]
        assert not healthy, f"the unfaulted topology burns too: {healthy}"
        print(f"critical burn alert fired {time.monotonic() - started:.0f}s after the fault")
    finally:
        stop.set()
        stack.fleet.set_fault(slowed, Fault())
        traffic.join(60)
