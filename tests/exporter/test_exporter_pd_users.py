"""A P/D topology as its users see it: on the same traffic, the exporter's topology figures count
each request once and time TTFT from the arrival at the entrypoint, as the client does; without
entrypoint metrics they fall back to the decode side, marked as such."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from crossover import catalog
from crossover.exporter.derive import WindowSums, merge, user_facing, window_sums
from crossover.exporter.parse import SeriesKey
from crossover.exporter.service import Exporter
from crossover.exporter.state import GroupView
from crossover.exporter.targets import parse_file_sd
from crossover.exporter.window import History
from crossover.netutil import free_port, spec_on_free_ports
from crossover.sim import fleet as sim_fleet
from crossover.spec import FleetSpec, load_spec, spec_targets
from tests.exporter.exporter_traffic import Timed, send
from tests.helpers import SPECS, agree_within_bucket, client_quantile

pytestmark = pytest.mark.timeout(180)

REQUESTS = 30
PROMPT_TOKENS = 1500
WINDOW_S = 60.0


def _spec(metrics_url: str | None = "proxy", dialect: str | None = None) -> FleetSpec:
    """The P/D example; its entrypoint's metrics_url kept (the proxy's), dropped, or replaced, and
    the dialect its proxy serves (catalog.DIALECTS; vLLM's by default)."""
    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    data = spec.model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d" and metrics_url != "proxy":
            topology["entrypoint"]["metrics_url"] = metrics_url
        if topology["name"] == "pd1p1d" and dialect is not None:
            topology["entrypoint"]["dialect"] = dialect
    return FleetSpec.model_validate(data)


async def _empty_metrics(request: web.Request) -> web.Response:
    return web.Response(text="# a router that exposes none of vLLM's families\n")


def _run(spec: FleetSpec, silent_router_port: int | None = None) -> tuple[GroupView, list[Timed], Exporter]:
    """30 streamed 1,500-token prompts through the pd1p1d entrypoint, 4 at a time, between two
    exporter cycles; the topology's figures over a window holding all of them."""
    topology = spec.topology("pd1p1d")
    assert topology.entrypoint.url is not None
    with sim_fleet.running_fleet(spec):
        async def scenario() -> tuple[Exporter, list[Timed], float]:
            runner = None
            if silent_router_port is not None:
                app = web.Application()
                app.router.add_get("/metrics", _empty_metrics)
                runner = web.AppRunner(app)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", silent_router_port).start()
            try:
                exporter = Exporter(spec)
                async with aiohttp.ClientSession() as session:
                    start = time.time()
                    await exporter.cycle(session, now=start)
                    timed = await send([topology.entrypoint.url or ""], spec.model.name, REQUESTS,
                                       concurrency=4, prompt_tokens=(PROMPT_TOKENS,), max_tokens=16)
                    await exporter.cycle(session, now=start + 30.0)
                    await exporter.cycle(session, now=start + 31.0)
                return exporter, timed, start + 31.0
            finally:
                if runner is not None:
                    await runner.cleanup()

        exporter, timed, _ = asyncio.run(scenario())
    view = next(v for v in exporter.snapshot.topologies if v.topology == "pd1p1d")
    return view, timed, exporter


def test_topology_counts_each_request_once_with_the_users_ttft() -> None:
    view, timed, exporter = _run(_spec())
    figures = view.windows["1m"]
    assert figures.requests_source == "entrypoint"
    ttft = figures.latency["ttft"]
    assert ttft.observations == REQUESTS
    assert figures.requests_per_second_by_reason["length"] * 31.0 == pytest.approx(REQUESTS)
    client = [t.ttft for t in timed]
    client_mean = sum(client) / len(client)
    # The proxy stamps arrival and first token a loopback hop inside the client's stamps: the
    # means differ by that hop; the p99 (interpolated in the buckets) by less than a bucket.
    assert ttft.mean <= client_mean and agree_within_bucket(ttft.mean, client_mean, catalog.TTFT.buckets)
    client_p99 = client_quantile(client, 0.99)
    assert agree_within_bucket(ttft.quantiles["0.99"], client_p99, catalog.TTFT.buckets), (ttft, client_p99)
    # Generated tokens from the decode role (the prefill's one token per request is not output),
    # prompt tokens from the prefill role: each counted once.
    assert figures.generation_tokens_per_second is not None
    assert figures.generation_tokens_per_second * 31.0 == pytest.approx(sum(t.tokens for t in timed))
    assert figures.prompt_tokens_per_second is not None
    assert figures.prompt_tokens_per_second * 31.0 == pytest.approx(REQUESTS * PROMPT_TOKENS)
    # The per-role view stays: each role saw every request once.
    roles = {r.role: r.windows["1m"] for r in exporter.snapshot.roles if r.topology == "pd1p1d"}
    assert set(roles) == {"prefill", "decode", "entrypoint"}
    assert roles["prefill"].latency["ttft"].observations == REQUESTS
    assert roles["decode"].latency["ttft"].observations == REQUESTS
    assert figures.kv_transfer is not None and figures.kv_transfer.transfers_per_second


def test_behind_llm_ds_router_the_topology_shows_what_its_users_waited_for() -> None:
    """The same P/D topology, its entrypoint serving llm-d's router families (and the deprecated
    ones beside them): each request once, TTFT from the arrival at the router, on llm-d's buckets."""
    view, timed, exporter = _run(_spec(dialect="llm-d"))
    figures = view.windows["1m"]
    assert figures.requests_source == "entrypoint"
    assert figures.requests_per_second is not None
    assert figures.requests_per_second * 31.0 == pytest.approx(REQUESTS)
    assert not any(figures.failed_requests_per_second.values()) and figures.failures_counted
    ttft = figures.latency["ttft"]
    assert ttft.observations == REQUESTS
    client = [t.ttft for t in timed]
    client_mean = sum(client) / len(client)
    buckets = catalog.LLMD_TTFT_BUCKETS
    assert ttft.mean <= client_mean and agree_within_bucket(ttft.mean, client_mean, buckets)
    client_p99 = client_quantile(client, 0.99)
    assert agree_within_bucket(ttft.quantiles["0.99"], client_p99, buckets), (ttft, client_p99)
    # ITL and TPOT from the router too (its own histograms), e2e for every request.
    assert figures.latency["itl"].observations == sum(t.tokens - 1 for t in timed)
    assert figures.latency["tpot"].observations == REQUESTS
    assert figures.latency["e2el"].observations == REQUESTS
    roles = {r.role for r in exporter.snapshot.roles if r.topology == "pd1p1d"}
    assert roles == {"prefill", "decode", "entrypoint"}


def test_without_entrypoint_metrics_the_decode_side_is_marked(caplog: Any) -> None:
    port = free_port()
    caplog.set_level(logging.WARNING, logger="crossover.exporter")
    view, timed, _ = _run(_spec(f"http://127.0.0.1:{port}/metrics"), silent_router_port=port)
    figures = view.windows["1m"]
    assert figures.requests_source == "decode"
    assert figures.latency["ttft"].observations == REQUESTS
    # Decode-side TTFT starts when the decoder gets the request, after the prefill: shorter than
    # what the client waited for.
    assert figures.latency["ttft"].mean < sum(t.ttft for t in timed) / len(timed)
    # Logged once, with what the router did serve (here: nothing but a comment).
    fallbacks = [r for r in caplog.records if "entrypoint target serves none" in r.getMessage()]
    assert len(fallbacks) == 1 and "pd1p1d" in fallbacks[0].getMessage()
    assert "llm-d" in fallbacks[0].getMessage() and "no metric families" in fallbacks[0].getMessage()


def test_file_sd_names_an_entrypoint_target() -> None:
    spec = load_spec(SPECS / "pd-8k-prompts.yaml")
    document = json.dumps([{"targets": ["router.example:9000"],
                            "labels": {"topology": "pd1p1d", "role": "entrypoint"}}])
    (target,) = parse_file_sd(document, spec, "sd.json")
    assert (target.role, target.gpus, target.metrics_url) == ("entrypoint", 0, "http://router.example:9000/metrics")
    # the spec's own entrypoint target: the proxy's metrics, no GPUs
    (entry,) = [t for t in spec_targets(spec) if t.role == "entrypoint"]
    assert (entry.topology, entry.gpus, entry.metrics_url) == ("pd1p1d", 0, "http://127.0.0.1:8319/metrics")


def _sums(series: dict[SeriesKey, float]) -> WindowSums:
    """One target whose counters rose by `series` over one second."""
    history = History(keep_seconds=1.0)
    history.add(0.0, dict.fromkeys(series, 0.0))
    history.add(1.0, series)
    window = history.window(1.0, 1.0)
    assert window is not None
    return window_sums(window)


def _histogram(family: str, count: float) -> dict[SeriesKey, float]:
    return {(family + "_bucket", (("le", "1.0"),)): count, (family + "_bucket", (("le", "+Inf"),)): count,
            (family + "_sum", ()): count, (family + "_count", ()): count}


def test_each_request_family_from_the_first_source_that_has_it() -> None:
    success = (catalog.REQUEST_SUCCESS.name + "_total", (("finished_reason", "length"),))
    generation, prompt = catalog.GENERATION_TOKENS.name + "_total", catalog.PROMPT_TOKENS.name + "_total"
    entry = _sums(_histogram(catalog.TTFT.name, 3.0))
    decode = _sums({**_histogram(catalog.TTFT.name, 5.0), **_histogram(catalog.ITL.name, 7.0), success: 2.0,
                    (generation, ()): 9.0})
    prefill = _sums({**_histogram(catalog.TTFT.name, 4.0), success: 2.0, (prompt, ()): 8.0,
                     (generation, ()): 1.0})
    out = user_facing(merge([prefill, decode]), [entry, decode], decode, prefill)
    assert out.histograms[catalog.TTFT.name].count.tolist() == [3.0]  # the entrypoint's
    assert out.histograms[catalog.ITL.name].count.tolist() == [7.0]  # none at the entrypoint: decode
    assert out.rates[catalog.REQUEST_SUCCESS.name].tolist() == [2.0]
    assert {r: v.tolist() for r, v in out.reason_rates.items()} == {"length": [2.0]}
    assert out.rates[catalog.GENERATION_TOKENS.name].tolist() == [9.0]
    assert out.rates[catalog.PROMPT_TOKENS.name].tolist() == [8.0]
    assert out.targets.tolist() == [2.0]  # the instances'
