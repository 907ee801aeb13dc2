"""The plan's validation and the seeded dataset: same requests for everyone, right arrival process."""

from __future__ import annotations

import numpy as np
import pytest

from crossover.errors import UserError
from crossover.loadgen.plan import (
    Arrival,
    LengthDist,
    LengthKind,
    Mode,
    SweepPlan,
    level_key,
    parse_levels,
    parse_slo_overrides,
)
from crossover.loadgen.traffic.dataset import arrival_offsets


def test_length_forms() -> None:
    assert LengthDist.parse("128") == LengthDist.fixed(128)
    uniform = LengthDist.parse("uniform:64-256")
    assert (uniform.kind, uniform.low, uniform.high) == (LengthKind.UNIFORM, 64, 256)
    normal = LengthDist.parse("normal:128,32,16-512")
    assert (normal.mean, normal.std, normal.low, normal.high) == (128, 32, 16, 512)
    assert LengthDist.parse(normal.describe()) == normal


@pytest.mark.parametrize("text", ["", "0", "abc", "uniform:5", "uniform:9-3", "normal:1", "normal:1,2,3"])
def test_bad_lengths_are_one_line_errors(text: str) -> None:
    with pytest.raises(UserError) as info:
        LengthDist.parse(text, "--input-len")
    assert "\n" not in str(info.value) and str(info.value).startswith("--input-len: "), info.value


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"levels": ()}, "levels"),
    ({"levels": (1, -2)}, "positive"),
    ({"levels": (1.5,)}, "whole numbers"),
    ({"levels": (2, 2)}, "duplicate"),
    ({"mode": Mode.OPEN, "levels": (1.0,)}, "requests_per_level or duration_s"),
    ({"timeout_s": 0}, "timeout_s"),
    ({"slos_ms": {"ttfb": 3}}, "unknown SLO"),
    ({"objective": 1.0}, "objective"),
    ({"warmup_s": -1}, "warmup_s"),
])
def test_bad_plans(kwargs: dict, fragment: str) -> None:
    with pytest.raises(UserError, match=fragment):
        SweepPlan(**kwargs)


def test_plan_round_trips_through_json_and_sorts_levels() -> None:
    plan = SweepPlan(mode=Mode.OPEN, levels=(2, 0.5), duration_s=3, arrival=Arrival.GAMMA, burstiness=0.5,
                     input_len=LengthDist.parse("normal:100,10"), slos_ms={"ttft": 100})
    assert plan.levels == (0.5, 2.0)
    assert SweepPlan.from_json(plan.to_json()) == plan
    assert [level_key(plan, x) for x in plan.levels] == ["r0.5", "r2"]
    assert plan.requests_for(2) == 6


def test_closed_loop_request_counts() -> None:
    assert SweepPlan(levels=(8,), rounds=2).requests_for(8) == 16
    assert SweepPlan(levels=(8,), requests_per_level=5).requests_for(8) == 5
    assert SweepPlan(levels=(8,), duration_s=4).requests_for(8) is None


def test_cli_parsers() -> None:
    assert parse_levels("1,2, 4", "--concurrency") == (1, 2, 4)
    for levels in ("0,4", "-1", "nan", "inf", "1,two", ""):
        with pytest.raises(UserError, match=r"^--rate: "):
            parse_levels(levels, "--rate")
    assert parse_slo_overrides(["ttft:2500", "tpot:50"]) == {"ttft": 2500, "tpot": 50}
    for bad in (["ttft"], ["foo:1"], ["ttft:-1"], ["ttft:nan"]):
        with pytest.raises(UserError):
            parse_slo_overrides(bad)


def test_poisson_and_gamma_arrivals_have_the_asked_rate_and_burstiness() -> None:
    n = 20000
    poisson = arrival_offsets(SweepPlan(mode=Mode.OPEN, levels=(4.0,), requests_per_level=n), 4.0, n)
    gaps = np.diff(poisson)
    assert poisson[0] == 0
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.03)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, rel=0.05)  # exponential: CV 1
    bursty = arrival_offsets(SweepPlan(mode=Mode.OPEN, levels=(4.0,), requests_per_level=n,
                                       arrival=Arrival.GAMMA, burstiness=0.25), 4.0, n)
    gaps = np.diff(bursty)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.1)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(2.0, rel=0.1)  # CV = 1/sqrt(shape)


def test_ramp_rises_linearly_then_holds_the_rate() -> None:
    n = 20000
    plan = SweepPlan(mode=Mode.OPEN, levels=(10.0,), requests_per_level=n, ramp_s=100)
    times = arrival_offsets(plan, 10.0, n)
    # expected count by t under a linear ramp: rate t^2 / (2 ramp)
    assert np.sum(times < 50) == pytest.approx(10 * 50**2 / 200, rel=0.06)
    assert np.sum(times < 100) == pytest.approx(500, rel=0.06)
    after = times[(times > 200) & (times < 1200)]
    assert len(after) == pytest.approx(10000, rel=0.04)
