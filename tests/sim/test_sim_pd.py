"""P/D through the entrypoint proxy: prefill with max_tokens=1, KV handed over, decode streams."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.contract import check_metrics_contract
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.sim.model import PerfModel
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS
from tests.sim.sim_client import get_text, post_json, stream

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
