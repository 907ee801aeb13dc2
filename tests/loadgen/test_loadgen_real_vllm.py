"""The sweep end to end against real vLLM CPU servers: one instance on both cores vs two
instances on one core each, balanced client-side (compose/specs/cpu-real-vllm.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.results import load_run
from crossover.loadgen.sweep import run_sweep


@pytest.mark.vllm
@pytest.mark.slow
def test_sweep_reports_every_level_on_real_vllm(real_vllm_fleet, tmp_path: Path) -> None:
    spec = real_vllm_fleet.spec
    plan = SweepPlan(levels=(1, 2, 4), rounds=2, input_len=LengthDist.fixed(16),
                     output_len=LengthDist.fixed(8), timeout_s=60)
    result = run_sweep(spec, plan, tmp_path, n_boot=50)
    requests = result.requests
    assert requests["ok"].all(), requests["error"].unique()
    assert (requests["output_tokens"] == 8).all()  # ignore_eos + min_tokens honoured
    assert (requests["input_tokens"] >= 16).all()  # usage from the server, not our plan
    # real vLLM sends continuous usage, so every event's token count is known
    assert all(sum(tokens) == 8 for tokens in requests["chunk_tokens"])
    assert all(len(itl) == 7 for itl in requests["itl"])
    summary = result.summary
    assert sorted(zip(summary["topology"], summary["level"], strict=True)) == [
        (t, lv) for t in ("big1x2c", "small2x1c") for lv in (1.0, 2.0, 4.0)]
    assert (summary["output_tps"] > 0).all() and (summary["failed"] == 0).all()
    small = requests[requests["topology"] == "small2x1c"]
    assert small["instance"].nunique() == 2  # both small replicas served
    run = load_run(tmp_path)
    assert len(run.requests) == len(requests) and run.crossover["sentences"]
