"""The second seed's question answered server side: at 8K-token prompts and 0.4 req/s, the
exporter's topology-level ITL p99 and goodput pick the same winner between
colocated and P/D as the client-side sweep does on the same traffic."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import pytest

from crossover.exporter.service import Exporter
from crossover.exporter.state import build_snapshot
from crossover.loadgen.analysis import results
from crossover.loadgen.analysis.summary import mark_requests
from crossover.loadgen.plan import LengthDist, Mode, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS
from tests.loadgen.loadgen_sim_process import sim_process

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

# Real speed. time_scale 2 (0.8 req/s of wall time, every latency and SLO halved, the ITL SLO still
# a bucket boundary at 25 ms) halves the run, but on a shared 2-core machine the proxy relaying
# 8K-token requests in the simulator's process then adds its own stalls to P/D's ITL (measured p99
# 80 ms simulated at 2x against 47 ms at 1x), which the test would compare instead of the model.
TIME_SCALE = 1.0
RATE = 0.4
INPUT_LEN, OUTPUT_LEN = 8192, 256  # the second seed's shape (docs/simulator.md)
REQUESTS = 20


def _scaled(spec: FleetSpec) -> FleetSpec:
    data = spec.model_dump(mode="json")
    data["simulator"]["time_scale"] = TIME_SCALE
    data["scrape"]["windows"] = ["10m"]
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
        if data["slos"].get(name) is not None:
            data["slos"][name] /= TIME_SCALE
    return FleetSpec.model_validate(data)


def _cycle(exporter: Exporter, now: float) -> None:
    async def once() -> None:
        async with aiohttp.ClientSession() as session:
            await exporter.cycle(session, now=now)
    asyncio.run(once())


def test_server_side_figures_pick_the_client_sides_winner(tmp_path: Path) -> None:
    spec = _scaled(spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml")))
    plan = SweepPlan(mode=Mode.OPEN, levels=(RATE * TIME_SCALE,), requests_per_level=REQUESTS,
                     input_len=LengthDist.fixed(INPUT_LEN), output_len=LengthDist.fixed(OUTPUT_LEN),
                     timeout_s=60, seed=2)
    exporter = Exporter(spec)
    with sim_process(spec, tmp_path, TIME_SCALE):
        start = time.time()
        _cycle(exporter, start)
        result = run_sweep(spec, plan, tmp_path / "run")
        _cycle(exporter, start + 60.0)
    assert result.requests["ok"].all(), result.requests["error"].unique()
    client = result.summary.set_index("topology")
    server = {v.topology: v.windows["10m"] for v in exporter.snapshot.topologies}
    assert server["pd1p1d"].requests_source == "entrypoint"
    for figures in server.values():
        assert figures.latency["ttft"].observations == REQUESTS
    # The sweep's own server view of each level (scraped before and after it) counts each request once.
    for topology in ("colocated", "pd1p1d"):
        view = json.loads(results.level_path(tmp_path / "run", plan, topology, plan.levels[0])
                          .with_suffix(results.SERVER_SUFFIX).read_text())
        sent = view["figures"]["requests_per_second"] * view["window_s"]
        assert sent == pytest.approx(REQUESTS), (topology, sent)

    def winner(values: Mapping[str, float], lower_wins: bool) -> str:
        return (min if lower_wins else max)(values, key=values.__getitem__)

    names = ("colocated", "pd1p1d")
    client_itl = {n: float(client.at[n, "itl_p99_ms"]) for n in names}  # type: ignore[arg-type]
    server_itl = {n: server[n].latency["itl"].quantiles["0.99"] * 1000 for n in names}
    report = f"client ITL p99 {client_itl}, server {server_itl}"
    assert winner(client_itl, True) == winner(server_itl, True), report
    # Not compared: the ITL SLO's attainment. The client judges a request by its worst gap of 256, the
    # server counts gaps, so one stall of a busy shared machine flips the client's share (0.15 vs 1.0
    # in one run, 0.05 vs 0.0 in the next) while the gap shares barely move.
    # Goodput (every per-request SLO met) at SLOs on bucket boundaries around the seed's TTFT 2 s and
    # TPOT 30 ms: the client's share lies within the server's Fréchet bounds, and where the client's
    # shares differ by more than twice the slack, the server picks the same winner. Slack: 2 requests,
    # and 3 below the lower bound, since the client's clock adds its own relay and event-loop delay to
    # every latency (a CI run measured exactly 2 below on P/D's TTFT at 1 s). Compared in requests. At
    # the seed's own thresholds, inside the 1-2.5 s and 25-50 ms buckets where both topologies' TTFT
    # and TPOT lie, no histogram can tell them apart (crossover validate warns about such SLOs).
    slack, slack_below = 2, 3
    decided = 0
    for ttft_ms, tpot_ms in itertools.product((1000.0, 2500.0), (25.0, 50.0)):
        slos = {"ttft": ttft_ms, "tpot": tpot_ms}
        marked = mark_requests(result.requests, slos)
        client_good = {n: int(marked.loc[marked["topology"] == n, "good"].sum()) for n in names}
        data = spec.model_dump(mode="json")
        data["slos"].update({"ttft_ms": ttft_ms, "tpot_ms": tpot_ms})
        health = list(exporter.health.values())
        snapshot = build_snapshot(FleetSpec.model_validate(data), health, start + 60.0)
        bounds = {v.topology: (v.windows["10m"].attainment_lower, v.windows["10m"].attainment_upper)
                  for v in snapshot.topologies}
        for n in names:
            lower, upper = bounds[n]
            assert lower is not None and upper is not None
            least, most = round(lower * REQUESTS) - slack_below, round(upper * REQUESTS) + slack
            assert least <= client_good[n] <= most, (slos, n, client_good, bounds)
        if abs(client_good["colocated"] - client_good["pd1p1d"]) > 2 * slack:
            server_good = {n: bounds[n][0] or 0.0 for n in names}
            assert winner(client_good, False) == winner(server_good, False), (slos, client_good, bounds)
            decided += 1
    assert decided, "no SLO on a boundary separated the topologies"
