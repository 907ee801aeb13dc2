"""Adaptive sweeps: where the next level goes, when the sweep stops, and a sweep end to end on
loopback servers whose curves cross (resumed level for level, the stop reason in the summary)."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from crossover import slo
from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.analysis.adaptive import (
    AdaptivePlan,
    Interval,
    check_budget,
    coarse_levels,
    decide,
    intervals,
    level_inside,
    level_sides,
)
from crossover.loadgen.analysis.crossings import bracket, split_levels
from crossover.loadgen.analysis.report import AdaptiveState, CrossoverReport
from crossover.loadgen.plan import LengthDist, Mode, SweepPlan
from crossover.loadgen.sweep import LevelDone, run_sweep
from crossover.spec import FleetSpec
from tests.helpers import SPECS
from tests.loadgen.loadgen_fake_server import Behaviour, fake_fleet


def _crossing(x: float, low: float | None, high: float | None,
              metric: str = slo.GOODPUT_REQUESTS) -> dict[str, Any]:
    return {"metric": metric, "kind": "crossing", "x": x, "ci_low": low, "ci_high": high,
            "topology_a": "a", "topology_b": "b"}


def _capacity(x: float | None, low: float | None, high: float | None, censored: str = "") -> dict[str, Any]:
    return {"topology": "a", "x": x, "ci_low": low, "ci_high": high, "censored": censored}


def _report(crossovers: list[dict[str, Any]],
            capacities: list[dict[str, Any]] | None = None) -> CrossoverReport:
    """A crossover report of these crossovers and capacities, as crossover.json holds them (the
    fields a test leaves out: a crossover.json of an older version leaves them out too)."""
    return CrossoverReport.from_json({"crossovers": crossovers, "capacities": capacities or []})


CLOSED = SweepPlan(levels=(1, 128), rounds=2)
OPEN = SweepPlan(mode=Mode.OPEN, levels=(0.5, 8), requests_per_level=20)


def test_coarse_start_is_the_low_end_and_the_log_middle() -> None:
    assert coarse_levels(CLOSED) == (1.0, 11.0)
    assert coarse_levels(OPEN) == (0.5, 2.0)
    assert coarse_levels(SweepPlan(levels=(1, 2))) == (1.0, 2.0)
    assert coarse_levels(SweepPlan(levels=(1, 4, 64))) == (1.0, 4.0, 64.0)  # given levels are the start
    with pytest.raises(UserError, match="--adaptive: give the range"):
        coarse_levels(SweepPlan(levels=(8,)))


def test_the_range_above_is_measured_only_while_an_answer_may_lie_there() -> None:
    none = {"metric": slo.GOODPUT_REQUESTS, "kind": "none", "topology_a": "a", "topology_b": "b"}
    no_crossing = _report([none], [_capacity(5.0, 4.0, 6.0)])
    decision = decide(no_crossing, AdaptivePlan(), CLOSED, [1, 11])
    assert decision.level == 38.0 and decision.widest is None  # the log middle of 11-128
    assert decide(no_crossing, AdaptivePlan(), CLOSED, [1, 11, 38]).level == 128.0  # 128/38 < 4
    # the metric crossing below and no capacity above: the high end is never measured
    below = _report([_crossing(9.0, 8.0, 10.0)], [_capacity(5.0, 4.9, 5.1)])
    assert decide(below, AdaptivePlan(target_ci=0.3), CLOSED, [1, 5, 9, 11]).stop_reason == "target"
    # a topology meeting the objective everywhere so far: up, unless capacities are not asked for
    above = _report([_crossing(9.0, 8.0, 10.0)], [_capacity(11.0, None, None, "above")])
    assert decide(above, AdaptivePlan(target_ci=0.3), CLOSED, [1, 9, 11]).level == 38.0
    assert decide(above, AdaptivePlan(target_ci=0.3, answers=("crossing",)), CLOSED, [1, 9, 11]).stop_reason \
        == "target"


def test_next_level_goes_inside_the_widest_interval() -> None:
    crossover = _report([_crossing(9.0, 6.0, 14.0), _crossing(3.0, 2.9, 3.1, metric="output_tps")],
                        [_capacity(40.0, 30.0, 50.0), _capacity(None, None, None, censored="below")])
    decision = decide(crossover, AdaptivePlan(target_ci=0.1), CLOSED, [1, 11, 128])
    # the crossing's 8/9 wide interval is wider than the capacity's 20/40; the other metric is ignored;
    # its estimate 9 lies near the edge of the measured bracket 1-11: the bracket's log middle first
    assert decision.widest is not None and decision.widest.what == f"{slo.GOODPUT_REQUESTS} crossing a/b"
    assert decision.level == 3.0 and not decision.stop_reason
    assert decide(crossover, AdaptivePlan(target_ci=0.1), CLOSED, [1, 6, 11, 128]).level == 9.0
    assert [i.what for i in decision.intervals] == [f"{slo.GOODPUT_REQUESTS} crossing a/b", "capacity a"]
    # the estimate already measured: the middle of the widest unmeasured gap inside the interval
    decision = decide(crossover, AdaptivePlan(target_ci=0.1), CLOSED, [1, 9, 11, 128])
    assert decision.level is not None and 6 <= decision.level <= 14 and decision.level not in (9, 11)


def test_the_sweep_stops_at_the_target_or_when_nothing_is_left() -> None:
    narrow = _report([_crossing(9.2, 8.8, 9.3)], [_capacity(40.0, 39.0, 41.0)])
    # narrow, but interpolated between far levels: the widest bracket first (the capacity's 11-128,
    # its estimate well inside), then the crossing's 1-11 until measured levels close in on it
    assert decide(narrow, AdaptivePlan(target_ci=0.1), CLOSED, [1, 11, 128]).level == 40.0
    assert decide(narrow, AdaptivePlan(target_ci=0.1), CLOSED, [1, 11, 40, 128]).level == 3.0
    assert decide(narrow, AdaptivePlan(target_ci=0.1), CLOSED, [1, 6, 11, 40, 128]).level == 9.0
    assert decide(narrow, AdaptivePlan(target_ci=0.1), CLOSED, [1, 6, 9, 11, 40, 128]).level == 10.0
    decision = decide(narrow, AdaptivePlan(target_ci=0.1), CLOSED, [1, 6, 9, 10, 11, 40, 128])
    assert decision.stop_reason == "resolution" and decision.level is None  # 9-10 is 11% of 9.2
    decision = decide(narrow, AdaptivePlan(target_ci=0.15), CLOSED, [1, 6, 9, 10, 11, 40, 128])
    assert decision.stop_reason == "target" and decision.level is None
    assert decide(_report([]), AdaptivePlan(), CLOSED, [1, 11, 128]).stop_reason \
        == "nothing-to-narrow"
    # every integer concurrency inside 8-10 measured: more levels cannot narrow it
    tight = _report([_crossing(9.0, 8.0, 10.0)])
    assert decide(tight, AdaptivePlan(target_ci=0.1), CLOSED, [1, 8, 9, 10, 128]).stop_reason == "resolution"
    # open loop: rates are not integers, a level goes between
    rates = level_inside(Interval("x", 2.0, 1.5, 2.5), [0.5, 2.0, 8.0], OPEN)
    assert rates is not None and 1.5 <= rates <= 2.5 and rates != 2.0
    # no interval yet (bootstrap had too few levels): infinitely wide, a level still goes in the range
    assert math.isinf(Interval("x", 9.0, None, None).width)


def test_bad_targets_and_budgets_name_their_flag() -> None:
    for bad in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(UserError, match=r"^--target-ci: "):
            AdaptivePlan(target_ci=bad)
    with pytest.raises(UserError, match=r"^--metric: "):
        AdaptivePlan(metric="speed")
    with pytest.raises(UserError, match=r"^--narrow: "):
        AdaptivePlan(answers=("crossover",))
    # the coarse start of 1 and 11 at 2 rounds is 24 requests per topology
    with pytest.raises(UserError, match=r"^--max-requests: 40 is less than the coarse start needs .* 48"):
        check_budget(CLOSED, AdaptivePlan(max_requests=40), 2)
    check_budget(CLOSED, AdaptivePlan(max_requests=48), 2)
    with pytest.raises(UserError, match=r"^--max-duration: "):
        check_budget(OPEN, AdaptivePlan(max_duration_s=20), 2)  # 20/0.5 + 20/2 s per topology


def test_the_old_goodput_names_are_read_as_the_new_ones() -> None:
    assert AdaptivePlan(metric="goodput").metric == slo.GOODPUT_REQUESTS
    old_run_json = {**AdaptivePlan().to_json(), "metric": "token_goodput"}
    assert AdaptivePlan.from_json(old_run_json).metric == slo.GOODPUT_TOKENS


def test_an_old_metric_name_is_accepted_with_a_deprecation_note(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _cli("--concurrency", "1,64", "--out", str(tmp_path / "run"), "--adaptive",
                     "--metric", "goodput", "--target-ci", "1", capsys=capsys)
    note, error = err.splitlines()
    assert "--metric goodput is deprecated" in note and f"use --metric {slo.GOODPUT_REQUESTS}" in note
    assert code == 2 and error.startswith("crossover sweep: --target-ci: "), err


@pytest.fixture
def crossing_fleet() -> Iterator[FleetSpec]:
    """One instance that slows down with load vs two slower ones that do not: the pair's output
    tokens/s per GPU cross near concurrency 9 (1/(8 + 2C) ms vs 2/(48 + C/5) ms per token)."""
    behaviours = {"big1x2c": Behaviour(ttft_s=0.008, tpot_s=0.008, per_token_s=0.002),
                  "small2x1c": Behaviour(ttft_s=0.008, tpot_s=0.024, per_token_s=0.0002)}
    with fake_fleet(behaviours.__getitem__) as (spec, _):
        yield spec


ADAPTIVE_PLAN = SweepPlan(levels=(1, 32), rounds=2, input_len=LengthDist.fixed(8),
                          output_len=LengthDist.fixed(8), slos_ms={"tpot": 1000.0})


@pytest.mark.slow
def test_an_adaptive_sweep_homes_in_and_resumes(crossing_fleet: FleetSpec, tmp_path: Path) -> None:
    adaptive = AdaptivePlan(target_ci=0.05, metric="output_tps", max_requests=400, answers=("crossing",))
    seen: list[LevelDone] = []
    result = run_sweep(crossing_fleet, ADAPTIVE_PLAN, tmp_path, on_level=seen.append, n_boot=50,
                       adaptive=adaptive)
    levels = sorted({level for _, level in result.measured_levels})
    files = len(result.measured_levels)  # a repeated level has one file per measurement
    state = json.loads((tmp_path / "crossover.json").read_text())["adaptive"]
    assert state["levels"][:2] == [1.0, 6.0] and sorted(state["levels"]) == levels
    # fewer levels than the integers in the range, and a level beside the final estimate
    widest = state["widest"]
    assert len(levels) < 10 and any(abs(lv - widest["x"]) <= 1 for lv in levels), state
    assert result.stop_reason in ("target", "resolution", "max-requests")
    assert len(result.requests) <= 400
    assert state["stop_reason"] == result.stop_reason
    if result.stop_reason == "target":
        assert widest["width"] <= 0.05
    assert state["requests"] == len(result.requests) and state["next_level"] is None
    assert seen[-1].position == seen[-1].total == files
    repeats = state["repeats"]
    assert files == 2 * (len(levels) + sum(n - 1 for n in repeats.values()))
    assert sorted((tmp_path / "levels" / "big1x2c").glob("*.repeat*.parquet")) == sorted(
        tmp_path / "levels" / "big1x2c" / f"c{int(float(x))}.repeat{r}.parquet"
        for x, n in repeats.items() for r in range(2, n + 1))
    if repeats:  # the summary pools a repeated level's measurements
        pooled = result.summary.set_index(["topology", "level"])["repeats"]
        assert all(pooled[("big1x2c", float(x))] == n for x, n in repeats.items())
    assert json.loads((tmp_path / "run.json").read_text())["adaptive"] == adaptive.to_json()
    # rerun: the same decisions from the same data, every level read back, none measured
    again = run_sweep(crossing_fleet, ADAPTIVE_PLAN, tmp_path, n_boot=50, adaptive=adaptive)
    assert again.measured_levels == [] and again.resumed_levels == files
    assert again.stop_reason == result.stop_reason
    assert len(again.requests) == len(result.requests)
    # a larger budget goes on from there (a stop for the budget was the only reason to stop)
    if result.stop_reason == "max-requests":
        more = run_sweep(crossing_fleet, ADAPTIVE_PLAN, tmp_path, n_boot=50,
                         adaptive=AdaptivePlan(target_ci=0.05, metric="output_tps", max_requests=2000))
        assert more.measured_levels and more.resumed_levels == files


def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["sweep", str(SPECS / "cpu-real-vllm.yaml"), *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (["--adaptive", "--target-ci", "1"], "--target-ci: must be a relative width between 0 and 1"),
    (["--adaptive", "--target-ci", "0"], "--target-ci: "),
    (["--adaptive", "--max-requests", "10"], "--max-requests: 10 is less than the coarse start needs"),
    (["--adaptive", "--narrow", "speed"], "--narrow: want one or both of crossing,capacity"),
    (["--workers", "0"], "--workers: must be between 1 and"),
    (["--workers", "4096"], "--workers: must be between 1 and"),
    (["--target-ci", "0.2"], "--target-ci: only for an adaptive sweep"),
    (["--adaptive", "--max-repeats", "0"], "--max-repeats: must be a whole number of at least 1"),
    (["--max-repeats", "2"], "--max-repeats: only for an adaptive sweep"),
    (["--shard", "2/2"], "--shard: want M/K"),
])
def test_bad_flags_are_one_line_and_exit_2_before_traffic(flags: list[str], message: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # the spec's URLs have no server: any traffic would fail, and the folder would be made
    code, err = _cli("--concurrency", "1,64", "--out", str(tmp_path / "run"), *flags, capsys=capsys)
    assert code == 2 and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_the_cli_summary_says_why_the_adaptive_sweep_stopped(crossing_fleet: FleetSpec, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps(crossing_fleet.model_dump(mode="json")))
    code = main(["sweep", str(spec_path), "--concurrency", "1,32", "--rounds", "2", "--input-len", "8",
                 "--output-len", "8", "--out", str(tmp_path / "run"), "--adaptive", "--metric", "output_tps",
                 "--target-ci", "0.5", "--bootstrap", "50", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    assert "adaptive sweep stopped: " in out and "levels measured: 1, 6" in out, out


def test_the_status_line_says_the_next_level_or_why_it_stopped() -> None:
    from crossover.loadgen.analysis.adaptive import adaptive_line

    running = {"levels": [1.0, 8.0], "next_level": 6.0, "stop_reason": "",
               "widest": {"what": f"{slo.GOODPUT_REQUESTS} crossing a/b", "x": 5.5, "width": None}}
    assert adaptive_line(AdaptiveState.from_json(running), "concurrency") == (
        f"adaptive sweep: levels 1, 8 so far; next concurrency 6 (to narrow the {slo.GOODPUT_REQUESTS} "
        "crossing a/b)")
    again = {**running, "levels": [1.0, 8.0, 6.0], "repeats": {"6": 2}, "next_repeat": 3}
    assert adaptive_line(AdaptiveState.from_json(again), "concurrency") == (
        "adaptive sweep: levels 1, 8, 6 (x2) so far; next concurrency 6 again "
        f"(repeat 3, to confirm its side of the {slo.GOODPUT_REQUESTS} crossing a/b)")
    done = {**running, "next_level": None, "stop_reason": "max-requests",
            "widest": {"what": "capacity a", "x": 40.0, "width": 0.25}}
    assert adaptive_line(AdaptiveState.from_json(done), "concurrency") == (
        "adaptive sweep stopped: the next level would overspend --max-requests; levels measured: 1, 8; "
        "widest interval: capacity a at concurrency 40, 25% of it")


def test_an_interval_between_two_whole_concurrencies_is_anchored_by_both() -> None:
    between = _report([_crossing(8.53, 8.26, 8.76)])
    plan = AdaptivePlan(target_ci=0.05)
    assert decide(between, plan, CLOSED, [1, 6, 14]).level == 9.0  # the nearest whole concurrency
    assert decide(between, plan, CLOSED, [1, 6, 9, 14]).level == 8.0
    assert decide(between, plan, CLOSED, [1, 6, 8, 9, 14]).stop_reason == "resolution"


def _step_sweep(plan: SweepPlan, step: float, adaptive: AdaptivePlan) -> tuple[list[float], Interval | None]:
    """An adaptive sweep over a synthetic jump: topology a's p99 ITL is 10 ms below `step` and 60
    ms above it, b's a flat 20 ms. The crossing is interpolated between the levels where the sign
    changes, with the narrow bootstrap interval that per-request noise alone would give."""
    def lead(level: float) -> float:
        return (10.0 if level < step else 60.0) - 20.0

    measured = list(coarse_levels(plan))
    for _ in range(30):
        ordered = sorted(measured)
        changes = [(lo, hi) for lo, hi in itertools.pairwise(ordered) if lead(lo) < 0 < lead(hi)]
        crossovers: list[dict[str, Any]] = []
        if changes:
            lo, hi = changes[0]
            x = lo + (hi - lo) * -lead(lo) / (lead(hi) - lead(lo))
            crossovers = [_crossing(x, x * 0.98, x * 1.02, metric="itl_p99")]
        elif lead(ordered[-1]) < 0:
            crossovers = [_itl_none()]
        decision = decide(_report(crossovers), adaptive, plan, measured)
        if decision.level is None:
            return measured, (decision.intervals[0] if decision.intervals else None)
        measured.append(decision.level)
    raise AssertionError(f"no stop after {measured}")


@pytest.mark.parametrize("step", [0.62, 1.23, 1.5, 3.1])
def test_a_jump_between_far_levels_is_bracketed_before_the_sweep_stops(step: float) -> None:
    # the P/D preset's shape: colocated p99 ITL jumps once prefills stall decodes; interpolating
    # between far rates puts the crossing anywhere between them with a narrow bootstrap interval
    plan = SweepPlan(mode=Mode.OPEN, levels=(0.5, 4.0), requests_per_level=20)
    adaptive = AdaptivePlan(target_ci=0.2, metric="itl_p99", answers=("crossing",))
    measured, found = _step_sweep(plan, step, adaptive)
    assert found is not None
    below = max(m for m in measured if m < step)
    above = min(m for m in measured if m > step)
    assert (above - below) / found.x <= 0.2, measured  # the step itself lies between close levels
    assert below <= found.x <= above
    assert len(measured) <= 8, measured


def test_a_jump_on_the_seed_axis_keeps_the_seed_levels() -> None:
    # a smooth crossing near concurrency 6.4 (the seed preset): 1, 8, then 3, 6, 7 as before
    crossing = _report([_crossing(6.4, 6.2, 6.6)])
    plan = SweepPlan(levels=(1, 64), rounds=4)
    adaptive = AdaptivePlan(target_ci=0.198, answers=("crossing",))
    measured = list(coarse_levels(plan))
    while (decision := decide(crossing, adaptive, plan, measured)).level is not None:
        measured.append(decision.level)
    assert measured == [1.0, 8.0, 3.0, 6.0, 7.0] and decision.stop_reason == "target"


def _itl_crossing(x: float) -> dict[str, Any]:
    # after the crossing b has the lower p99 ITL: b is ahead
    return {**_crossing(x, x * 0.98, x * 1.02, metric="itl_p99"), "winner": "b", "loser": "a"}


def _itl_none() -> dict[str, Any]:
    # no crossing in the levels so far: a keeps the lower p99 ITL throughout
    return {"metric": "itl_p99", "kind": "none", "topology_a": "a", "topology_b": "b", "winner": "a",
            "loser": "b"}


def _by_repeat(readings: dict[float, list[float]]) -> pd.DataFrame:
    """Rows of summarize_repeats: a's p99 ITL per level and repeat as given, b's a flat 20 ms."""
    return pd.DataFrame([{"topology": name, "level": level, "repeat": r, "itl_p99_ms": value}
                         for level, values in readings.items() for r, a in enumerate(values, 1)
                         for name, value in (("a", a), ("b", 20.0))])


def test_a_bracket_end_is_measured_again_until_its_repeats_agree() -> None:
    plan = SweepPlan(mode=Mode.OPEN, levels=(0.5, 4.0), requests_per_level=20)
    adaptive = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",))
    crossing = _report([_itl_crossing(1.3)])
    measured = [0.5, 1.41, 4.0, 1.12]
    interval = decide(crossing, adaptive, plan, measured).intervals[0]
    assert level_sides(interval, _by_repeat({1.41: [60.0, 10.0, 60.0]}), 1.41) == [1, -1, 1]
    # without repeats the bracket 1.12-1.41 would be accepted: each end is measured again first
    readings = {0.5: [10.0], 1.41: [60.0], 4.0: [60.0], 1.12: [10.0]}
    assert decide(crossing, adaptive, plan, measured).stop_reason == "target"  # no repeat data: as before
    step = decide(crossing, adaptive, plan, measured, _by_repeat(readings))
    assert (step.level, step.repeat) == (1.12, 2) and step.widest == interval
    readings[1.12].append(10.0)  # agrees: the upper end next
    step = decide(crossing, adaptive, plan, measured, _by_repeat(readings))
    assert (step.level, step.repeat) == (1.41, 2)
    readings[1.41].append(60.0)  # agrees too: both ends are confirmed
    assert decide(crossing, adaptive, plan, measured, _by_repeat(readings)).stop_reason == "target"
    three = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",), max_repeats=3)
    step = decide(crossing, three, plan, measured, _by_repeat(readings))  # three must agree
    assert (step.level, step.repeat) == (1.12, 3)
    one = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",), max_repeats=1)
    assert decide(crossing, one, plan, measured, _by_repeat({1.12: [10.0]})).stop_reason == "target"


def test_an_end_whose_repeats_split_is_not_measured_a_third_time() -> None:
    # 1.41's repeats read both sides of the jump: it lies in the jump's band, the analysis's
    # bracket reaches past it (crossings.split_levels), and the sweep narrows beside the band
    plan = SweepPlan(mode=Mode.OPEN, levels=(0.5, 4.0), requests_per_level=20)
    adaptive = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",))
    measured = [0.5, 1.41, 4.0, 1.12]
    readings = {0.5: [10.0], 1.41: [60.0, 10.0], 4.0: [60.0, 60.0], 1.12: [10.0, 10.0]}
    crossing = {**_itl_crossing(1.3), "bracket_low": 1.12, "bracket_high": 4.0}
    split = _report([crossing])
    step = decide(split, adaptive, plan, measured, _by_repeat(readings))
    assert (step.level, step.repeat) == (2.37, 1)  # the log middle of the wider gap, 1.41-4
    measured.append(2.37)
    readings[2.37] = [60.0, 60.0]
    split = _report([{**crossing, "bracket_high": 2.37}])
    step = decide(split, adaptive, plan, measured, _by_repeat(readings))
    assert (step.level, step.repeat) == (1.83, 1)  # (2.37 - 1.12) / 1.3 is still too wide
    narrow = AdaptivePlan(target_ci=0.99, metric="itl_p99", answers=("crossing",))
    assert decide(split, narrow, plan, measured, _by_repeat(readings)).stop_reason == "target"


def test_the_sweep_climbs_once_the_highest_levels_repeats_agree() -> None:
    # the climb spends the range's dearest levels on the highest level's word that the crossing
    # lies above it: that word is taken as a bracket end's is
    plan = SweepPlan(mode=Mode.OPEN, levels=(0.5, 4.0), requests_per_level=20)
    adaptive = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",))
    none = _report([_itl_none()])
    measured = [0.5, 1.41]

    def step(top: list[float], how: AdaptivePlan = adaptive) -> tuple[float | None, int]:
        decision = decide(none, how, plan, measured, _by_repeat({0.5: [10.0], 1.41: top}))
        return decision.level, decision.repeat

    assert decide(none, adaptive, plan, measured).level == 4.0  # no repeat data: as before
    assert step([10.0]) == (1.41, 2)
    assert step([10.0, 10.0]) == (4.0, 1)
    # they disagree: 1.41 lies in the jump's band, which may reach above it; the climb bounds it
    assert step([10.0, 60.0]) == (4.0, 1)
    three = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",), max_repeats=3)
    assert step([10.0, 10.0], three) == (1.41, 3) and step([10.0, 10.0, 10.0], three) == (4.0, 1)
    assert step([10.0], AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",),
                                     max_repeats=1)) == (4.0, 1)


def _chancy_step_sweep(step: float, reads_jump: Any) -> tuple[list[float], dict[float, int], Interval]:
    """An adaptive sweep over a jump that one level reads by chance: a's p99 ITL is 60 ms when
    reads_jump(level, repeat) else 10 ms; b's a flat 20 ms. The pooled reading of a level is the
    mean over its repeats (a stand-in for the p99 of the pooled records)."""
    plan = SweepPlan(mode=Mode.OPEN, levels=(0.5, 4.0), requests_per_level=20)
    adaptive = AdaptivePlan(target_ci=0.25, metric="itl_p99", answers=("crossing",))
    readings: dict[float, list[float]] = {}
    measured: list[float] = []

    def measure(level: float) -> None:
        values = readings.setdefault(level, [])
        values.append(60.0 if reads_jump(level, len(values) + 1) else 10.0)

    for level in coarse_levels(plan):
        measured.append(level)
        measure(level)
    for _ in range(40):
        ordered = sorted(measured)
        lead = {x: sum(readings[x]) / len(readings[x]) - 20.0 for x in ordered}
        changes = [(lo, hi) for lo, hi in itertools.pairwise(ordered) if lead[lo] < 0 < lead[hi]]
        crossovers: list[dict[str, Any]] = []
        if changes:
            lo, hi = changes[0]
            x = lo + (hi - lo) * -lead[lo] / (lead[hi] - lead[lo])
            between = bracket(ordered, x, split_levels(_by_repeat(readings), "itl_p99_ms", "a", "b"))
            assert between is not None
            crossovers = [{**_itl_crossing(x), "bracket_low": between[0], "bracket_high": between[1]}]
        elif lead[ordered[-1]] < 0:
            crossovers = [_itl_none()]
        decision = decide(_report(crossovers), adaptive, plan, measured,
                          _by_repeat(readings))
        if decision.level is None:
            assert decision.stop_reason == "target" and decision.intervals, decision
            return measured, {x: len(v) for x, v in readings.items()}, decision.intervals[0]
        if decision.repeat == 1:
            measured.append(decision.level)
        measure(decision.level)
    raise AssertionError(f"no stop after {readings}")


def test_a_level_that_read_the_wrong_side_by_chance_does_not_end_the_bracket() -> None:
    # the P/D preset's first run: the jump lies at 1.23, and 1.41's first level missed it by
    # chance; without repeats the sweep accepted 1.41-1.83. Its repeats read the jump, the pooled
    # reading moves the crossing below 1.41, and the bracket that is accepted holds the jump.
    def reads_jump(level: float, repeat: int) -> bool:
        return level > 1.23 and not (level == 1.41 and repeat == 1)

    measured, repeats, found = _chancy_step_sweep(1.23, reads_jump)
    below = max(m for m in measured if m <= found.x)
    above = min(m for m in measured if m >= found.x)
    assert below <= 1.23 <= above and (above - below) / found.x <= 0.25, (measured, found)
    assert repeats[below] >= 2 and repeats[above] >= 2 and repeats[1.41] >= 2
    assert 4.0 not in measured  # 1.41's repeat read the jump before the sweep climbed past it


def test_levels_in_the_jumps_band_widen_the_bracket_to_hold_the_jump() -> None:
    # the P/D preset on the model, seed 14: just above the jump (1.23) a level reads it or not by
    # its arrival sequence; pooling such a level's repeats picked a side by chance and closed the
    # bracket on 1.25-1.41, above the jump. Split levels bound nothing, so the bracket holds it.
    def reads_jump(level: float, repeat: int) -> bool:
        return level > 1.3 or (level > 1.23 and repeat % 2 == 0)

    measured, repeats, found = _chancy_step_sweep(1.23, reads_jump)
    assert found.between is not None and found.between[0] <= 1.23 <= found.between[1], (measured, found)
    assert max(repeats.values()) <= 2, repeats


def test_an_interval_spans_the_measured_levels_either_side_of_its_estimate() -> None:
    # a bootstrap interval of 1.08-1.12 between levels 1.09 and 1.41 says little about a step
    # anywhere in between: the interval the sweep narrows (and reports) reaches both levels
    adaptive = AdaptivePlan(metric="itl_p99", answers=("crossing", "capacity"))
    crossing = {**_crossing(1.1, 1.08, 1.12, metric="itl_p99"), "bracket_low": 1.09, "bracket_high": 1.41}
    capacity = {**_capacity(1.1, 1.05, 1.15), "bracket_low": 1.0, "bracket_high": 1.2}
    found = intervals(_report([crossing], [capacity]), adaptive)
    assert [(i.low, i.high) for i in found] == [(1.08, 1.41), (1.0, 1.2)]
    assert found[0].width == pytest.approx((1.41 - 1.08) / 1.1)
    # an older crossover.json without brackets, and a crossing without a bootstrap interval
    assert intervals(_report([_crossing(1.1, 1.08, 1.12, metric="itl_p99")]), adaptive)[0].low == 1.08
    assert intervals(_report([{**crossing, "ci_low": None, "ci_high": None}]), adaptive)[0].width == math.inf
