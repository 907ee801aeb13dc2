"""Prefix caching in the simulator: vLLM V1's chained block hashes, reuse, LRU eviction and counters."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from crossover.catalog import PREFIX_CACHE_HITS, PROMPT_TOKENS_BY_SOURCE
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import running_fleet
from crossover.sim.model import PerfModel
from crossover.sim.scheduler import Scheduler, SimRequest, chained_block_hashes
from crossover.sim.truth import conversation_ttfts
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS
from tests.test_real_vllm import CPU_BLOCK_SIZE, EXPECTED_PREFIX_DELTA, REPEATED_PROMPT, prefix_delta

SEED = load_spec(SPECS / "seed-70b-h100.yaml")


def with_block_size(spec: FleetSpec, block_size: int) -> FleetSpec:
    data = spec.model_dump(mode="json")
    data["simulator"]["block_size"] = block_size
    return FleetSpec.model_validate(data)


def test_hashes_chain_full_blocks_only() -> None:
    a = chained_block_hashes(list(range(40)), 16)
    b = chained_block_hashes([99, *range(1, 40)], 16)
    assert len(a) == 2 and len(chained_block_hashes(list(range(15)), 16)) == 0
    assert a[0] != b[0] and a[1] != b[1]  # a change in block 0 changes every later hash
    assert chained_block_hashes(list(range(48)), 16)[:2] == a


def test_simulator_counts_a_repeated_prompt_as_real_vllm_does() -> None:
    """The same request pair and expected deltas as tests/test_real_vllm.py's real-server check."""
    spec = spec_on_free_ports(with_block_size(load_spec(SPECS / "seed-70b-h100.yaml"), CPU_BLOCK_SIZE))
    with running_fleet(spec):
        url = spec.topologies[1].instances[0].url
        assert prefix_delta(url, spec.model.name) == EXPECTED_PREFIX_DELTA


def _run(scheduler: Scheduler, request: SimRequest, now: float = 0.0) -> float:
    scheduler.add(request)
    while not request.finished:
        plan = scheduler.plan(now)
        assert plan is not None
        now += plan.seconds
        scheduler.complete(plan, now)
    return now


def test_cached_tokens_are_not_computed_and_lru_evicts() -> None:
    model = PerfModel.for_instance(SEED, 4)
    scheduler = Scheduler(model)
    prompt = list(range(4000))
    first = SimRequest("a", len(prompt), 1, 0.0, block_hashes=chained_block_hashes(prompt, 16))
    _run(scheduler, first)
    second = SimRequest("b", len(prompt), 1, 0.0, block_hashes=chained_block_hashes(prompt, 16))
    scheduler.add(second)
    plan = scheduler.plan(0.0)
    assert plan is not None and plan.work == [(second, 4000 - 3984)]  # 249 full blocks of 4000 - 1
    assert second.cached_tokens == 3984
    scheduler.complete(plan, plan.seconds)
    assert scheduler.free_blocks == model.kv_capacity_blocks  # cached blocks are free, not lost
    # Filling the cache with other prompts evicts the oldest unreferenced blocks first.
    capacity = model.kv_capacity_blocks
    for index in range(capacity // 250 + 1):
        other = [f"x{index}-{i}" for i in range(4000)]
        _run(scheduler, SimRequest(f"o{index}", 4000, 1, 0.0, block_hashes=chained_block_hashes(other, 16)))
    third = SimRequest("c", len(prompt), 1, 0.0, block_hashes=chained_block_hashes(prompt, 16))
    scheduler.add(third)
    scheduler.plan(0.0)
    assert third.cached_tokens == 0
    assert len(scheduler.cache_refs) <= capacity


def test_a_continued_conversation_has_a_falling_ttft() -> None:
    ttfts = conversation_ttfts(SEED, "tp4x1", turns=5, input_len=1000, output_len=100)
    cold = conversation_ttfts(SEED, "tp4x1", turns=5, input_len=1000, output_len=100, prefix_caching=False)
    assert all(warm < c for warm, c in zip(ttfts[1:], cold[1:], strict=True))
    assert ttfts[4] < 0.5 * cold[4]


def test_chat_prompt_keys_match_the_token_count() -> None:
    from crossover.sim.server import count_chat_tokens, prompt_keys
    messages = [{"role": "user", "content": "a b c"}, {"role": "assistant", "content": "d e"}]
    assert len(prompt_keys({"messages": messages}, chat=True)) == count_chat_tokens(messages)
    body = {"model": "m", "prompt": REPEATED_PROMPT}
    assert prompt_keys(json.loads(json.dumps(body)), chat=False) == REPEATED_PROMPT
    assert urllib.request  # the module's client is the shared helper's


@pytest.mark.slow
def test_a_five_turn_sweep_shows_prefix_cache_hits_and_a_falling_ttft(tmp_path: Path) -> None:
    """`crossover sweep --turns 5` on the measured H200 spec: each conversation opens with a long
    document and follows up briefly, as chats do; every later turn's prompt holds the whole history,
    yet its TTFT falls below the first turn's, because the cache serves the history (counted by the
    server as hits and as `local_cache_hit` prompt tokens)."""
    import yaml

    from crossover.cli import main
    from crossover.loadgen.analysis.results import load_run
    from tests.test_real_vllm import prefix_counters

    def document(n: int) -> str:  # each conversation its own, far longer than the machine's noise
        return " ".join(f"d{n}w{i}" for i in range(6000))

    def message(n: int, k: int) -> str:
        return document(n) if k == 0 else f"follow up {k} of conversation {n}"

    conversations = [{"id": str(n), "conversations": [
        turn for k in range(5) for turn in ({"from": "human", "value": message(n, k)},
                                            {"from": "gpt", "value": " ".join(["answer"] * 20)})]}
        for n in range(3)]
    dataset = tmp_path / "conversations.json"
    dataset.write_text(json.dumps(conversations))
    spec = spec_on_free_ports(load_spec(SPECS / "llama70b-h200.yaml"))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    url = spec.topology("tp8x1").instances[0].url
    with running_fleet(spec):
        before = prefix_counters(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
        code = main(["sweep", str(spec_path), "--out", str(tmp_path / "run"), "--topology", "tp8x1",
                     "--concurrency", "1", "--num-prompts", "15", "--endpoint", "chat", "--turns", "5",
                     "--dataset-name", "sharegpt", "--dataset-path", str(dataset), "--bootstrap", "0",
                     "--no-progress"])
        after = prefix_counters(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())
    assert code == 0
    run = load_run(tmp_path / "run")
    assert run.requests["ok"].all() and len(run.requests) == 15
    turns = run.turns.set_index("turn")
    assert list(turns.index) == [1, 2, 3, 4, 5]
    assert turns["input_tokens"].is_monotonic_increasing  # each turn carries the history
    ttft = turns["ttft_p50_ms"]
    assert all(ttft[k] < 0.25 * ttft[1] for k in (2, 3, 4, 5)), ttft.to_dict()
    delta = {name: after[name] - before.get(name, 0.0) for name in after}
    hits = delta[PREFIX_CACHE_HITS.name]
    # every later turn finds at least the document's full blocks in the cache
    assert hits >= 3 * 4 * (6000 // spec.simulator.block_size) * spec.simulator.block_size, delta
    assert hits == delta[f"{PROMPT_TOKENS_BY_SOURCE.name}:local_cache_hit"], delta
