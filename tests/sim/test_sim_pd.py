"""P/D through the entrypoint proxy: prefill with max_tokens=1, KV handed over, decode streams."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.exporter.service import Exporter
from crossover.loadgen.traffic.sse import MAX_PENDING_BYTES
from crossover.netutil import spec_on_free_ports
from crossover.pdproxy.proxy import _Stream
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.sim.model import PerfModel
from crossover.spec import Fault, FleetSpec, load_spec
from devkit.contract import check_metrics_contract
from tests.helpers import SPECS
from tests.sim.sim_client import get_text, post_json, stream, stream_timed

PROMPT_TOKENS = 1500


@pytest.fixture(scope="module")
def pd_fleet() -> Iterator[tuple[SimFleet, FleetSpec]]:
    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    with running_fleet(spec) as fleet:
        yield fleet, spec


def _samples(text: str) -> dict[str, float]:
    return {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if "le" not in s.labels and "finished_reason" not in s.labels and "reason" not in s.labels}


def test_streamed_request_goes_prefill_then_decode(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    fleet, spec = pd_fleet
    topology = spec.topology("pd1p1d")
    prefill, decode = (i.url for i in topology.instances)
    body = {"model": spec.model.name, "prompt": " ".join(["w"] * PROMPT_TOKENS), "max_tokens": 10,
            "ignore_eos": True, "stream_options": {"include_usage": True}}
    assert topology.entrypoint.url is not None
    events = stream(topology.entrypoint.url + "/v1/completions", body)
    tokens = [e for e in events if e["choices"]]
    assert len(tokens) == 10 and tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"] == {"prompt_tokens": PROMPT_TOKENS, "total_tokens": PROMPT_TOKENS + 10,
                                   "completion_tokens": 10}

    on_prefill = _samples(get_text(prefill + "/metrics"))
    assert on_prefill[catalog.PROMPT_TOKENS.name + "_total"] == PROMPT_TOKENS
    assert on_prefill[catalog.GENERATION_TOKENS.name + "_total"] == 1  # max_tokens=1
    assert on_prefill[catalog.NIXL_XFER_TIME.name + "_count"] == 0

    decode_text = get_text(decode + "/metrics")
    assert check_metrics_contract(decode_text) == []
    on_decode = _samples(decode_text)
    model = PerfModel.for_instance(spec, 1)
    assert on_decode[catalog.GENERATION_TOKENS.name + "_total"] == 10
    assert on_decode[catalog.NIXL_XFER_TIME.name + "_count"] == 1
    assert on_decode[catalog.NIXL_BYTES.name + "_sum"] == model.kv_transfer_bytes(PROMPT_TOKENS)
    assert on_decode[catalog.NIXL_XFER_TIME.name + "_sum"] == pytest.approx(
        model.kv_transfer_seconds(PROMPT_TOKENS))
    # The decoder's TTFT includes the wait for the KV transfer.
    assert on_decode[catalog.TTFT.name + "_sum"] >= model.kv_transfer_seconds(PROMPT_TOKENS)
    # The client saw the decoder's completion id, and the decoder recorded its timeline.
    records = fleet.requests(topology.instances[1].name)
    assert records[-1]["id"] == tokens[0]["id"] and len(records[-1]["token_times"]) == 10


def test_non_streamed_request_through_the_proxy(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    _, spec = pd_fleet
    url = spec.topology("pd1p1d").entrypoint.url
    assert url is not None
    status, body = post_json(url + "/v1/chat/completions", {
        "model": spec.model.name, "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 5, "ignore_eos": True})
    assert status == 200 and body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["message"]["role"] == "assistant"


def test_proxy_forwards_errors(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    _, spec = pd_fleet
    url = spec.topology("pd1p1d").entrypoint.url
    assert url is not None
    status, body = post_json(url + "/v1/completions", {"model": "nope", "prompt": "a"})
    assert status == 404 and "nope" in body["message"]


def _entrypoint_families(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """The proxy's /metrics as family -> labels (without engine/model_name) -> value."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(get_text(url + "/metrics")):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items()
                                  if k not in ("engine", "model_name")))
            out.setdefault(sample.name, {})[labels] = sample.value
    return out


def test_entrypoint_metrics_time_what_the_client_waited_for(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    _, spec = pd_fleet
    url = spec.topology("pd1p1d").entrypoint.url
    assert url is not None
    before = _entrypoint_families(url)
    body = {"model": spec.model.name, "prompt": " ".join(["w"] * PROMPT_TOKENS), "max_tokens": 6,
            "ignore_eos": True}
    timed = stream_timed(url + "/v1/completions", body)
    after = _entrypoint_families(url)

    def grew(sample: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after[sample][labels] - before.get(sample, {}).get(labels, 0.0)

    assert grew(catalog.REQUEST_SUCCESS.name + "_total", (("finished_reason", "length"),)) == 1
    assert grew(catalog.TTFT.name + "_count") == 1
    assert grew(catalog.ITL.name + "_count") == 5  # one gap between each of the six tokens
    assert grew(catalog.TPOT.name + "_count") == 1 and grew(catalog.E2E_LATENCY.name + "_count") == 1
    # TTFT from the arrival at the proxy covers the prefill and the KV transfer.
    model = PerfModel.for_instance(spec, 1)
    assert grew(catalog.TTFT.name + "_sum") >= model.kv_transfer_seconds(PROMPT_TOKENS)
    client_decode = timed[-1][0] - timed[0][0]
    assert grew(catalog.ITL.name + "_sum") == pytest.approx(client_decode, abs=0.05)
    # vLLM's bucket boundaries and labels, as the catalog names them.
    buckets = sorted(float(dict(k)["le"]) for k in after[catalog.TTFT.name + "_bucket"])
    assert tuple(buckets[:-1]) == catalog.TTFT.buckets
    text = get_text(url + "/metrics")
    family = next(f for f in text_string_to_metric_families(text) if f.name == catalog.TTFT.name)
    assert set(family.samples[0].labels) == {*catalog.TTFT.labels, "le"}
    assert family.samples[0].labels["model_name"] == spec.model.name


def test_entrypoint_counts_failures(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    fleet, spec = pd_fleet
    topology = spec.topology("pd1p1d")
    url = topology.entrypoint.url
    assert url is not None
    error = ((("finished_reason", "error"),))
    before = _entrypoint_families(url)[catalog.REQUEST_SUCCESS.name + "_total"].get(error, 0.0)
    fleet.set_fault(topology.instances[0].name, Fault(error_rate=1.0))
    try:
        status, _ = post_json(url + "/v1/completions",
                              {"model": spec.model.name, "prompt": "a", "max_tokens": 2})
    finally:
        fleet.clear_faults()
    assert status == 500
    # A client's own mistake (HTTP 4xx) is no finished request, as in vLLM.
    status, _ = post_json(url + "/v1/completions", {"model": "nope", "prompt": "a"})
    assert status == 404
    after = _entrypoint_families(url)
    assert after[catalog.REQUEST_SUCCESS.name + "_total"][error] == before + 1


def test_a_client_that_leaves_counts_as_vllm_counts_it(pd_fleet: tuple[SimFleet, FleetSpec]) -> None:
    """As vLLM 0.32's API server (crossover.slo): an answered request (2xx) with the TTFT of the
    tokens it got, under no finished reason and without e2e latency."""
    _, spec = pd_fleet
    url = spec.topology("pd1p1d").entrypoint.url
    assert url is not None
    http = catalog.HTTP_REQUESTS.promql_name
    answered = (("handler", "/v1/completions"), ("method", "POST"), ("status", "2xx"))

    def counts() -> tuple[float, float, float, float]:
        families = _entrypoint_families(url)
        return (families.get(http, {}).get(answered, 0.0),
                sum(families[catalog.REQUEST_SUCCESS.name + "_total"].values()),
                families[catalog.TTFT.name + "_count"][()], families[catalog.E2E_LATENCY.name + "_count"][()])

    before = counts()
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps({
        "model": spec.model.name, "prompt": "a b c", "max_tokens": 2000, "ignore_eos": True,
        "stream": True}).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.readline().startswith(b"data: ")
    deadline = time.monotonic() + 20
    while counts()[0] == before[0]:
        assert time.monotonic() < deadline, "the proxy never counted the request whose client left"
        time.sleep(0.1)
    answered_now, finished, ttft, e2e = counts()
    assert (answered_now, finished, ttft, e2e) == (before[0] + 1, before[1], before[2] + 1, before[3])


def test_sse_reader_finds_tokens_whatever_the_chunking() -> None:
    events = [b'data: {"choices":[{"text":"a","finish_reason":null}]}\n\n',
              b'data: {"choices":[{"text":"b","finish_reason":null}]}\r\r',  # lone CR line ends
              b'data: {"choices":[{"text":"c","finish_reason":"stop"}]}\r\n\r\n',
              b'data: {"choices":[],"usage":{"completion_tokens":3}}\n\n', b"data: [DONE]\n\n"]
    whole = b"".join(events)
    for size in (1, 7, len(whole)):
        reader = _Stream()
        for start in range(0, len(whole), size):
            reader.feed(whole[start:start + size], float(start))
        reader.finish(float(len(whole)))
        assert len(reader.tokens) == 3 and reader.reason == "stop", size


def test_sse_reader_reads_a_last_event_without_its_blank_line() -> None:
    reader = _Stream()
    reader.feed(b'data: {"choices":[{"text":"a","finish_reason":"length"}]}', 1.0)
    assert reader.reason is None
    reader.finish(2.0)
    assert (reader.tokens, reader.reason) == ([2.0], "length")


def test_sse_reader_stops_reading_a_stream_that_is_not_sse() -> None:
    reader = _Stream()
    reader.feed(b'data: {"choices":[{"text":"a","finish_reason":"stop"}]}\n\n', 1.0)
    reader.feed(b"x" * (MAX_PENDING_BYTES + 1), 2.0)  # no event boundary: not SSE
    reader.feed(b'\n\ndata: {"choices":[{"text":"b","finish_reason":"stop"}]}\n\n', 3.0)
    reader.finish(4.0)
    assert reader.tokens == [1.0]


def test_decode_instances_speak_the_connector_of_the_spec() -> None:
    data = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml")).model_dump(mode="json")
    data["simulator"]["kv_connector"] = "mooncake"
    spec = FleetSpec.model_validate(data)
    topology = spec.topology("pd1p1d")
    exporter = Exporter(spec)
    with running_fleet(spec):
        assert topology.entrypoint.url is not None
        start = time.time()
        asyncio.run(_cycle(exporter, start))
        stream(topology.entrypoint.url + "/v1/completions", {
            "model": spec.model.name, "prompt": " ".join(["w"] * PROMPT_TOKENS), "max_tokens": 2,
            "ignore_eos": True})
        decode_text = get_text(topology.instances[1].url + "/metrics")
        asyncio.run(_cycle(exporter, start + 10.0))
    on_decode = _samples(decode_text)
    model = PerfModel.for_instance(spec, 1)
    assert on_decode[catalog.MOONCAKE_XFER_TIME.name + "_count"] == 1
    assert on_decode[catalog.MOONCAKE_BYTES.name + "_sum"] == model.kv_transfer_bytes(PROMPT_TOKENS)
    assert catalog.MOONCAKE_FAILED_RECVS.name + "_total" in on_decode
    assert not [name for name in on_decode if name.startswith(catalog.NIXL_XFER_TIME.name)]
    assert check_metrics_contract(decode_text) == []
    # The exporter reads KV transfer from whichever connector's families the instances expose.
    (figures,) = [v.windows["1m"] for v in exporter.snapshot.topologies if v.topology == "pd1p1d"]
    assert figures.kv_transfer is not None and figures.kv_transfer.time is not None
    assert figures.kv_transfer.time.observations == 1
    moved = model.kv_transfer_bytes(PROMPT_TOKENS)
    assert figures.kv_transfer.bytes_per_second == pytest.approx(moved / 10.0)


async def _cycle(exporter: Exporter, now: float) -> None:
    async with aiohttp.ClientSession() as session:
        await exporter.cycle(session, now=now)
