"""The performance model and the scheduler, fed directly (no servers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover.sim.model import PerfModel, StepLoad, allreduce_latency_s
from crossover.sim.scheduler import Scheduler, SimRequest
from crossover.sim.truth import open_loop, replay
from crossover.spec import FleetSpec, Interconnect, load_spec
from tests.helpers import SPECS

SEED = load_spec(SPECS / "seed-70b-h100.yaml")
PD = load_spec(SPECS / "pd-8k-prompts.yaml")


def _physical(spec: FleetSpec, **simulator: object) -> FleetSpec:
    data = spec.model_dump(mode="json")
    data["simulator"] = {"seed": 0, **simulator}
    return FleetSpec.model_validate(data)


def test_seed_tp_overhead_figures() -> None:
    """80 layers x 2 x 100 us = 16 ms (TP4 NVLink); x 60 us = 9.6 ms (TP2); TP4 PCIe ~480 ms."""
    assert PerfModel.for_instance(SEED, 4).tp_overhead_s == pytest.approx(0.016)
    assert PerfModel.for_instance(SEED, 2).tp_overhead_s == pytest.approx(0.0096)
    assert 80 * 2 * allreduce_latency_s(Interconnect.PCIE, 4) == pytest.approx(0.48)
    assert allreduce_latency_s(Interconnect.NVLINK, 1) == 0
    assert allreduce_latency_s(Interconnect.NVLINK, 4, override_us=7) == pytest.approx(7e-6)


def test_batch_one_decode_is_weight_read_plus_allreduce() -> None:
    spec = _physical(SEED)
    model = PerfModel.for_instance(spec, 4)
    weights = 70.6e9 * 2 / 4 / (3350e9 * 0.85)
    assert model.step_seconds(StepLoad(decode_seqs=1)) == pytest.approx(weights + 0.016)
    assert SEED.model.kv_bytes_per_token == 320 * 1024


def test_kv_capacity_from_memory_minus_weights() -> None:
    tp2 = PerfModel.for_instance(SEED, 2)
    usable = 80 * 1024**3 * 0.92 * 2 - 70.6e9 * 2
    assert tp2.kv_capacity_tokens == pytest.approx(usable / (320 * 1024), abs=16)
    assert PerfModel.for_instance(SEED, 4).kv_capacity_tokens > 8 * tp2.kv_capacity_tokens


def test_long_prefill_is_compute_bound_and_chunked() -> None:
    model = PerfModel.for_instance(PD, 1)
    decode = model.step_seconds(StepLoad(decode_seqs=2, decode_context_tokens=16000))
    mixed = model.step_seconds(StepLoad(decode_seqs=2, decode_context_tokens=16000, prefill_tokens=2048,
                                        prefill_attention_pairs=2048 * 4096, prefill_seqs=1))
    assert 0.018 < decode < 0.030 and mixed > 5 * decode


def test_chunked_prefill_respects_the_token_budget() -> None:
    model = PerfModel.for_instance(PD, 1)
    scheduler = Scheduler(model)
    scheduler.add(SimRequest("a", 8192, 4, 0.0))
    chunks = []
    now = 0.0
    while (plan := scheduler.plan(now)) is not None and not scheduler.running[0].generated:
        chunks.append(plan.load.prefill_tokens)
        now += plan.seconds
        scheduler.complete(plan, now)
    assert chunks == [2048, 2048, 2048, 2048]


def test_preemption_when_the_kv_cache_fills() -> None:
    data = PD.model_dump(mode="json")
    data["hardware"]["memory_gib"] = 17.3  # ~0.6 GiB of KV: about 4.5K tokens
    model = PerfModel.for_instance(FleetSpec.model_validate(data), 1)
    scheduler = Scheduler(model)
    requests = [SimRequest(f"r{i}", 900, 400, 0.0) for i in range(4)]
    for request in requests:
        scheduler.add(request)
    now, finished = 0.0, 0
    while (plan := scheduler.plan(now)) is not None:
        assert scheduler.free_blocks >= 0
        now += plan.seconds
        finished += len(scheduler.complete(plan, now).finished)
    assert finished == 4 and scheduler.preemptions > 0
    assert scheduler.free_blocks == model.kv_capacity_blocks
    assert all(r.generated == 400 for r in requests)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 300)), min_size=1, max_size=12),
       st.integers(1, 8))
def test_scheduler_finishes_everything_and_frees_all_blocks(shapes: list[tuple[int, int]], seqs: int) -> None:
    data = PD.model_dump(mode="json")
    data["hardware"]["memory_gib"] = 17.5  # about 6.5K tokens of KV
    data["simulator"]["max_num_seqs"] = seqs
    model = PerfModel.for_instance(FleetSpec.model_validate(data), 1)
    scheduler = Scheduler(model)
    requests = [SimRequest(f"r{i}", p, o, 0.0) for i, (p, o) in enumerate(shapes)]
    for request in requests:
        scheduler.add(request)
    now = 0.0
    for _ in range(100_000):
        plan = scheduler.plan(now)
        if plan is None:
            break
        assert len(scheduler.running) <= seqs
        assert sum(tokens for r, tokens in plan.work if r.computed < r.prefill_target) <= 2048
        now += plan.seconds
        scheduler.complete(plan, now)
    assert all(r.finished and r.generated == r.output_tokens for r in requests)
    assert scheduler.free_blocks == model.kv_capacity_blocks


def test_pd_decoder_waits_for_the_kv_transfer() -> None:
    model = PerfModel.for_instance(PD, 1)
    scheduler = Scheduler(model)
    request = SimRequest("d", 8192, 3, 0.0, remote_kv=True)
    scheduler.add(request)
    assert scheduler.plan(0.0) is None  # KV in flight: nothing to compute yet
    assert scheduler.num_waiting == 1 and len(scheduler.transferring) == 1
    ready = scheduler.next_kv_ready()
    assert ready is not None
    assert ready == pytest.approx(8192 * 128 * 1024 / 25e9 + 0.001)
    plan = scheduler.plan(ready)
    assert plan is not None and plan.load.prefill_tokens == 1  # only the last prompt token


def test_open_loop_is_repeatable() -> None:
    first = open_loop(PD, "colocated", 0.4, 2048, 32, 20)
    again = open_loop(PD, "colocated", 0.4, 2048, 32, 20)
    assert [t.token_times for t in first.traces] == [t.token_times for t in again.traces]


def test_replay_reads_the_latencies_of_the_send_times_it_is_given() -> None:
    """A live level's own send times fed to the model: open loop's arrivals read the same, the same
    requests sent in one burst queue behind each other's prefills."""
    poisson = open_loop(PD, "colocated", 0.4, 2048, 32, 20)
    arrivals = [t.arrival for t in poisson.traces]
    again = replay(PD, "colocated", arrivals, 2048, 32)
    assert [t.token_times for t in again.traces] == [t.token_times for t in poisson.traces]
    assert again.rate == pytest.approx(19 / (arrivals[-1] - arrivals[0]))
    burst = replay(PD, "colocated", [arrivals[0]] * len(arrivals), 2048, 32)
    assert burst.itl_quantile(0.99) > poisson.itl_quantile(0.99)
    assert max(t.ttft for t in burst.traces) > 2 * max(t.ttft for t in poisson.traces)


def test_pd_closed_loop_ttft_includes_prefill_and_transfer() -> None:
    from crossover.sim.truth import closed_loop

    point = closed_loop(PD, "pd1p1d", 1, 2048, 32)
    model = PerfModel.for_instance(PD, 1)
    prefill = model.step_seconds(StepLoad(prefill_tokens=2048, prefill_attention_pairs=2048 * 2049 / 2,
                                          prefill_seqs=1))
    assert point.ttft_s > prefill + model.kv_transfer_seconds(2048)
    assert point.ttft_s < 2 * (prefill + model.kv_transfer_seconds(2048)) + 0.1
    assert point.output_tokens_per_s > 0


def test_attention_over_earlier_context_runs_at_its_own_rate() -> None:
    """Only the pairs over earlier context take attention_mfu_after_context; without it one rate holds."""
    h200 = load_spec(SPECS / "llama70b-h200.yaml")
    data = h200.model_dump(mode="json")
    del data["hardware"]["attention_mfu_after_context"]
    one_rate = FleetSpec.model_validate(data)
    at_zero = StepLoad(prefill_tokens=2048, prefill_attention_pairs=2048 * 2049 / 2, prefill_seqs=1,
                       prefill_context_tokens=2048)
    later = StepLoad(prefill_tokens=2048, prefill_attention_pairs=2048 * 6144 + 2048 * 2049 / 2,
                     prefill_seqs=1, prefill_context_tokens=8192, prefill_earlier_pairs=2048 * 6144)
    two, one = PerfModel.for_instance(h200, 2), PerfModel.for_instance(one_rate, 2)
    assert two.shard_gpu_seconds(at_zero) == pytest.approx(one.shard_gpu_seconds(at_zero))
    hardware = h200.hardware
    assert hardware.attention_mfu_after_context is not None
    extra = 80 * 4 * 32 * 128 * 2048 * 6144 / (hardware.bf16_tflops * 1e12) * (
        1 / hardware.attention_mfu_after_context - 1 / hardware.attention_mfu)
    assert two.shard_gpu_seconds(later) - one.shard_gpu_seconds(later) == pytest.approx(extra)


def test_the_scheduler_counts_a_later_chunks_pairs_over_earlier_context() -> None:
    scheduler = Scheduler(PerfModel.for_instance(PD, 1))
    scheduler.add(SimRequest("a", 8192, 4, 0.0))
    earlier, now = [], 0.0
    while (plan := scheduler.plan(now)) is not None and not scheduler.running[0].generated:
        earlier.append(plan.load.prefill_earlier_pairs)
        now += plan.seconds
        scheduler.complete(plan, now)
    assert earlier == [2048 * start for start in (0, 2048, 4096, 6144)]
