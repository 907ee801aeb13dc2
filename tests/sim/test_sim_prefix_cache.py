"""Prefix caching in the simulator: vLLM V1's chained block hashes, reuse, LRU eviction and counters."""

from __future__ import annotations

import json
import urllib.request

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
