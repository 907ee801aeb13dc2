"""One live stack per test process: the simulated fleet of a spec, a real Prometheus scraping it
with the generated scrape config and rules, and a burst of streamed traffic to every topology.

Shared by tests/rules and tests/dashboards (started once, stopped when the process exits), so the
two suites pay for one fleet and one Prometheus. Loopback only, bounded in time.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from crossover.netutil import spec_on_free_ports
from crossover.rules.generate import Format, outputs
from crossover.rules.model import RulesConfig, RuleSet, build_rules
from crossover.rules.prom import PrometheusServer, running_prometheus
from crossover.rules.recording import RecordingRule
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS, require, require_binary

TRAFFIC_SECONDS = 14.0
CONCURRENCY = 3  # streams per topology
MAX_TOKENS = 16
PROMPT = " ".join(["token"] * 300)


@dataclass
class LiveStack:
    spec: FleetSpec
    rules: RuleSet
    prometheus: PrometheusServer
    folder: Path
    fleet: Any  # crossover.sim.fleet.SimFleet
    requests_done: dict[str, int]
    traffic_ended: float
    exporter_url: str | None = None

    def fresh_traffic(self, max_age_s: float = 20.0) -> None:
        """Serve another burst when the last one ended too long ago for the 1m windows to see it
        whole (a burst lasts TRAFFIC_SECONDS)."""
        if time.monotonic() - self.traffic_ended > max_age_s:
            for name, count in asyncio.run(_drive(self.spec, TRAFFIC_SECONDS)).items():
                self.requests_done[name] += count
            self.traffic_ended = time.monotonic()

    @property
    def evaluations_s(self) -> float:
        """Time for every rule group to evaluate twice (the slowest is a minute apart), and a margin."""
        return 2 * max(g.interval_s or 0.0 for g in self.rules.groups) + 30

    def wait_for_every_group(self) -> None:
        """Each rule group evaluates at its own offset within its own interval (a minute for the long
        SLI windows): wait until the last rule of each has data."""
        last = [g.rules[-1].record for g in self.rules.groups if isinstance(g.rules[-1], RecordingRule)]
        self.prometheus.wait_until(lambda: all(self.prometheus.query(name) for name in last),
                                   self.evaluations_s, f"data in {last}")


_STACKS: dict[str, LiveStack] = {}
_EXIT = contextlib.ExitStack()
atexit.register(_EXIT.close)  # a fallback: the conftest fixtures close it at session end


def close_all() -> None:
    """Stop every stack (Prometheus first, then the exporter and the fleet)."""
    _STACKS.clear()
    _EXIT.close()


def _fast_scrape(spec: FleetSpec) -> FleetSpec:
    """Scrape every 2 s so a short burst of traffic gives rules several evaluations, with a timeout
    that a loaded 2-core machine still meets."""
    data = spec.model_dump(mode="json")
    data["scrape"].update({"interval": "2s", "timeout": "2s"})
    return FleetSpec.model_validate(data)


def drive(spec: FleetSpec, seconds: float, stop: threading.Event | None = None) -> dict[str, int]:
    """Blocking: stream requests to every topology for `seconds` or until `stop` is set (callable
    from a thread)."""
    return asyncio.run(_drive(spec, seconds, stop))


async def _drive(spec: FleetSpec, seconds: float, stop: threading.Event | None = None) -> dict[str, int]:
    done: dict[str, int] = {t.name: 0 for t in spec.topologies}
    deadline = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=30)

    async def worker(session: aiohttp.ClientSession, topology: str, urls: list[str], offset: int) -> None:
        turn = offset
        while time.monotonic() < deadline and not (stop and stop.is_set()):
            url = urls[turn % len(urls)]
            turn += 1
            body = {"model": spec.model.name, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "stream": True,
                    "ignore_eos": True}
            # On a loaded machine a request may outlive the burst: bound it, never fail the burst.
            timeout = aiohttp.ClientTimeout(total=max(5.0, deadline - time.monotonic() + 10.0))
            try:
                async with session.post(url + "/v1/completions", json=body, timeout=timeout) as response:
                    async for _ in response.content:
                        pass
                    if response.status == 200:
                        done[topology] += 1
            except (TimeoutError, aiohttp.ClientError):
                continue

    async with aiohttp.ClientSession(timeout=timeout) as session:
        workers = []
        for topology in spec.topologies:
            entry = topology.entrypoint.url
            urls = [entry] if entry else [i.url for i in topology.instances]
            workers += [worker(session, topology.name, urls, k) for k in range(CONCURRENCY)]
        await asyncio.gather(*workers)
    return done


def _start_exporter(spec: FleetSpec) -> str | None:
    """The crossover exporter over the same fleet, when its package is present; its URL."""
    try:
        from crossover.exporter.service import Exporter, running_exporter
    except ImportError:
        return None
    return str(_EXIT.enter_context(running_exporter(Exporter(spec))))


def live_stack(spec_file: str, config: RulesConfig | None = None, warm_up: bool = True) -> LiveStack:
    """The stack for compose/specs/<spec_file> (and rules config), started on first use with
    traffic already served."""
    key = f"{spec_file} {config!r}"
    if key in _STACKS:
        return _STACKS[key]
    require_binary("prometheus")
    try:
        from crossover.sim.fleet import running_fleet
    except ImportError:  # pragma: no cover - the simulator is another helper's area
        require(False, "the simulator (crossover.sim.fleet) is not available")
        raise
    spec = _fast_scrape(spec_on_free_ports(load_spec(SPECS / spec_file)))
    rules = build_rules(spec, config or RulesConfig(), spec_file)
    folder = Path(_EXIT.enter_context(tempfile.TemporaryDirectory(prefix="crossover-live-")))
    fleet = _EXIT.enter_context(running_fleet(spec))
    exporter_url = _start_exporter(spec)
    target = exporter_url.removeprefix("http://") if exporter_url else None
    for name, text in outputs(spec, rules, Format.PLAIN, spec_file, Path(spec_file).stem, target).items():
        (folder / name).write_text(text)
    prometheus = _EXIT.enter_context(running_prometheus(folder / "prometheus.yml"))

    targets = (sum(len(t.instances) + (1 if t.entrypoint.metrics_url else 0) for t in spec.topologies)
               + (1 if exporter_url else 0))
    prometheus.wait_until(lambda: list(prometheus.targets_up().values()).count("up") == targets, 60,
                          f"all {targets} targets up")
    done = drive(spec, TRAFFIC_SECONDS if warm_up else 0.0)
    stack = LiveStack(spec, rules, prometheus, folder, fleet, done, time.monotonic(), exporter_url)
    _STACKS[key] = stack
    return stack

