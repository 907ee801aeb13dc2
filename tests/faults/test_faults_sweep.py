"""Sweep under faults: 5xx, connection resets mid-stream, timeouts and SSE garbage are failed
requests, never good ones, and never hang the sweep.

Against the simulator's real fault injection (error_rate, drop_rate, slowdown), and against a small
loopback server for the kinds of garbage a broken proxy or server can stream. The cross-check that
makes "never good" testable: every request the sweep counts as good must be one the simulator
served to the end, token for token.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from aiohttp import web

from crossover import slo
from crossover.loadgen.analysis.summary import mark_requests
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.spec import Fault, FleetSpec, load_spec, parse_spec
from tests.faults.faults_servers import serving, tokenizer_routes
from tests.helpers import SPECS

pytestmark = pytest.mark.timeout(120)

OUTPUT_LEN = 12
SEED_SPEC = load_spec(SPECS / "seed-70b-h100.yaml")


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[SimFleet, FleetSpec]]:
    spec = spec_on_free_ports(SEED_SPEC)
    with running_fleet(spec) as fleet:
        yield fleet, spec


@pytest.fixture
def fleet(sim: tuple[SimFleet, FleetSpec]) -> Iterator[tuple[SimFleet, FleetSpec]]:
    yield sim
    sim[0].clear_faults()


def _plan(requests: int, concurrency: int = 2, timeout_s: float = 30.0) -> SweepPlan:
    return SweepPlan(levels=(concurrency,), requests_per_level=requests, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(OUTPUT_LEN), timeout_s=timeout_s, seed=3)


def _served(fleet: SimFleet, spec: FleetSpec) -> dict[str, dict[str, Any]]:
    """completion id -> the simulator's record of a request it finished."""
    return {r["id"]: r for t in spec.topologies for i in t.instances for r in fleet.requests(i.name)}


def _assert_good_only_if_served(requests: pd.DataFrame, served: dict[str, dict[str, Any]],
                                slos_ms: dict[str, float]) -> pd.DataFrame:
    marked = mark_requests(requests, slos_ms)
    for _, row in marked[marked["good"]].iterrows():
        record = served.get(row["completion_id"])
        assert record is not None, f"good request {row['completion_id']} was never finished by the server"
        assert record["output_tokens"] == row["output_tokens"] == row["planned_output"]
    failed = marked[~marked["ok"]]
    assert not failed["good"].any()
    assert (failed["error"] != "").all(), failed[["status", "error"]]
    return marked


def test_5xx_and_resets_mid_stream_are_failed_never_good(fleet: tuple[SimFleet, FleetSpec],
                                                         tmp_path: Path) -> None:
    running, spec = fleet
    running.set_fault("tp2-0", Fault(error_rate=0.5))
    running.set_fault("tp2-1", Fault(drop_rate=0.6))
    started = time.monotonic()
    result = run_sweep(spec, _plan(requests=24), tmp_path, n_boot=0)
    assert time.monotonic() - started < 90  # bounded: no request waits beyond its timeout
    requests = result.requests
    # nothing lost: every planned request is a row, per topology
    assert requests.groupby("topology").size().to_dict() == {"tp2x2": 24, "tp4x1": 24}
    healthy = requests[requests["topology"] == "tp4x1"]
    assert healthy["ok"].all(), healthy["error"].unique()
    faulty = requests[requests["topology"] == "tp2x2"]
    by_instance = {url: group for url, group in faulty.groupby("instance")}
    errors = by_instance[spec.topology("tp2x2").instances[0].url]
    drops = by_instance[spec.topology("tp2x2").instances[1].url]
    assert (~errors["ok"]).sum() >= 2 and (~drops["ok"]).sum() >= 2
    assert set(errors.loc[~errors["ok"], "status"]) == {500}
    assert errors.loc[~errors["ok"], "error"].str.startswith("HTTP 500").all()
    # a reset after some tokens: the stream never reached [DONE]; the partial tokens count for nothing
    assert (drops.loc[~drops["ok"], "output_tokens"] == 0).all()
    marked = _assert_good_only_if_served(requests, _served(running, spec), spec.slos.thresholds_ms)
    row = result.summary.set_index("topology").loc["tp2x2"]
    assert row["failed"] == (~faulty["ok"]).sum()
    assert row["attainment"] <= (faulty["ok"]).mean()
    assert row["attainment"] == pytest.approx(marked[marked["topology"] == "tp2x2"]["good"].mean())


def test_a_stalled_server_times_out_and_the_sweep_goes_on(fleet: tuple[SimFleet, FleetSpec],
                                                         tmp_path: Path) -> None:
    running, spec = fleet
    running.set_fault("tp4-0", Fault(slowdown=2000.0))  # ~10 s per decode step: beyond any timeout
    started = time.monotonic()
    result = run_sweep(spec, _plan(requests=4, timeout_s=1.0), tmp_path, n_boot=0)
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"a 1 s timeout x 2 rounds took {elapsed:.1f} s (unstalled: 120 s a request)"
    stalled = result.requests[result.requests["topology"] == "tp4x1"]
    assert len(stalled) == 4 and not stalled["ok"].any()
    assert stalled["error"].str.startswith("timeout after 1 s").all()
    assert result.summary.set_index("topology").loc["tp4x1", slo.GOODPUT_REQUESTS] == 0
    healthy = result.requests[result.requests["topology"] == "tp2x2"]
    assert healthy["ok"].all(), healthy["error"].unique()
    _assert_good_only_if_served(result.requests, _served(running, spec), spec.slos.thresholds_ms)


# ---- SSE garbage from a loopback server --------------------------------------------------------

def _event(text: str, tokens: int, request_id: str = "cmpl-garbage") -> bytes:
    body = {"id": request_id, "object": "text_completion",
            "choices": [{"index": 0, "text": text, "finish_reason": None}],
            "usage": {"prompt_tokens": 4, "completion_tokens": tokens, "total_tokens": 4 + tokens}}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _stream(request: web.Request, parts: list[bytes], pause: float = 0.0,
                  content_type: str = "text/event-stream") -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": content_type})
    await response.prepare(request)
    for part in parts:
        await response.write(part)
        if pause:
            await asyncio.sleep(pause)
    await response.write_eof()
    return response


async def _only_junk(request: web.Request) -> web.StreamResponse:
    return await _stream(request, [b"nonsense\n\n", b"data: {broken json\n\n", b"data: [1, 2]\n\n",
                                   b": comment\n\n", b"data: [DONE]\n\n"])


async def _html(request: web.Request) -> web.StreamResponse:
    return await _stream(request, [b"<html><body>502 Bad Gateway</body></html>"], content_type="text/html")


async def _no_done(request: web.Request) -> web.StreamResponse:
    return await _stream(request, [_event(" a", 1), _event(" b", 2), _event(" c", 3)])


async def _no_boundary(request: web.Request) -> web.StreamResponse:
    # an event that never ends: 5 MB without a blank line
    return await _stream(request, [b"data: " + b"x" * (1024 * 1024)] * 5)


async def _trickle(request: web.Request) -> web.StreamResponse:
    # keep-alive comments forever: the total timeout, not an idle one, must end it
    return await _stream(request, [b": keep-alive\n\n"] * 10_000, pause=0.05)


async def _error_event(request: web.Request) -> web.StreamResponse:
    return await _stream(request, [_event(" a", 1), b'data: {"error": {"message": "engine died"}}\n\n',
                                   b"data: [DONE]\n\n"])


async def _inflated(request: web.Request) -> web.StreamResponse:
    # a well-formed stream whose usage claims far more tokens than were asked for (max_tokens)
    return await _stream(request, [_event(" a", 1), _event(" b", 1_000_000), b"data: [DONE]\n\n"])


GARBAGE = {"junk": _only_junk, "html": _html, "nodone": _no_done, "noboundary": _no_boundary,
           "trickle": _trickle, "errorevent": _error_event}


def _garbage_spec(base_url: str, kinds: list[str]) -> FleetSpec:
    """One topology whose instances are the garbage kinds (round robin: each gets its share)."""
    data = SEED_SPEC.model_dump(mode="json")
    instances = [{"name": f"{kind}-0", "url": f"{base_url}/{kind}"} for kind in kinds]
    data["topologies"] = [{"name": "garbage", "gpus": 2 * len(kinds), "tensor_parallel_size": 2,
                           "instances": instances}]
    data["simulator"]["faults"] = {}
    return parse_spec(data)


def test_sse_garbage_is_failed_never_good_and_never_hangs(tmp_path: Path) -> None:
    routes = {("POST", f"/{kind}/v1/completions"): handler for kind, handler in GARBAGE.items()}
    with serving(routes | tokenizer_routes(*(f"/{kind}" for kind in GARBAGE))) as server:
        spec = _garbage_spec(server.url, list(GARBAGE))
        started = time.monotonic()
        result = run_sweep(spec, _plan(requests=2 * len(GARBAGE), concurrency=3, timeout_s=1.5), tmp_path,
                           n_boot=0)
        elapsed = time.monotonic() - started
    assert elapsed < 60, f"garbage sweep took {elapsed:.1f} s (the keep-alive trickle alone: 500 s)"
    requests = result.requests.assign(kind=result.requests["instance"].str.rsplit("/", n=1).str[-1])
    assert requests.groupby("kind").size().to_dict() == dict.fromkeys(GARBAGE, 2)
    assert not requests["ok"].any(), requests.loc[requests["ok"], ["kind", "error"]]
    reasons = requests.groupby("kind")["error"].agg(set).to_dict()
    assert reasons["junk"] == {"no tokens in the stream"}
    assert reasons["html"] == {"no tokens in the stream"}
    assert reasons["nodone"] == {"stream ended before [DONE]"}
    assert all(r.startswith("not an event stream") for r in reasons["noboundary"])
    assert all(r.startswith("timeout after 1.5 s") for r in reasons["trickle"])
    assert all(r.startswith("error event: engine died") for r in reasons["errorevent"])
    assert (requests.loc[requests["kind"] == "junk", "garbage"] >= 2).all()
    summary = result.summary.iloc[0]
    assert summary[slo.GOODPUT_REQUESTS] == 0 and summary["failed"] == 2 * len(GARBAGE)
    assert summary["attainment"] == 0


def test_a_stream_claiming_more_tokens_than_asked_is_not_good(tmp_path: Path) -> None:
    # Found by this suite (the usage count was trusted) and fixed in loadgen/traffic/client.py build_record.
    with serving({("POST", "/inflated/v1/completions"): _inflated} | tokenizer_routes("/inflated")) as server:
        spec = _garbage_spec(server.url, ["inflated"])
        result = run_sweep(spec, _plan(requests=2, timeout_s=5), tmp_path, n_boot=0)
    requests = result.requests
    assert len(requests) == 2
    assert not mark_requests(requests, spec.slos.thresholds_ms)["good"].any(), \
        requests[["ok", "output_tokens", "planned_output"]]
    assert (requests["output_tokens"] <= requests["planned_output"]).all()
    assert requests["error"].str.startswith("protocol violation: 1000000 output tokens").all()
