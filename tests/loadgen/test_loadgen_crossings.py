"""Crossings of PCHIP curves on the log2 concurrency axis, bootstrap intervals, and capacities."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from crossover.loadgen.analysis.crossings import bracket, find_crossovers, max_load_meeting_objective
from crossover.loadgen.analysis.summary import summarize
from crossover.loadgen.plan import Mode

LEVELS = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]


def _summary(curves: dict[str, list[float]], column: str = "output_tps_per_gpu") -> pd.DataFrame:
    rows = [{"topology": name, "level": level, column: value, "gpus": 4, "duration_s": 1.0}
            for name, values in curves.items() for level, value in zip(LEVELS, values, strict=True)]
    return pd.DataFrame(rows)


def test_crossing_of_straight_lines_on_log2_axis() -> None:
    u = np.log2(LEVELS)
    summary = _summary({"tp4x1": list(200 + 100 * u), "tp2x2": list(170 + 150 * u)})
    (result,) = find_crossovers(summary, None, "output_tps", pairs=[("tp4x1", "tp2x2")])
    assert result.kind == "crossing" and result.crossings == 1
    assert result.x == pytest.approx(2 ** 0.6, rel=1e-6)
    assert (result.winner, result.loser, result.direction) == ("tp2x2", "tp4x1", "b_overtakes_a")
    assert result.sentence.startswith(
        "tp2x2 overtakes tp4x1 in output tokens/s per GPU at concurrency about 1.5")


def test_latency_metric_winner_is_the_lower_curve() -> None:
    summary = _summary({"a": [10, 20, 40, 80, 160, 320], "b": [15, 22, 30, 45, 60, 90]},
                       column="tpot_p99_ms")
    (result,) = find_crossovers(summary, None, "tpot_p99")
    assert result.x is not None
    assert result.winner == "b" and 2 < result.x < 4


def test_no_crossing_and_several_crossings_are_said_plainly() -> None:
    summary = _summary({"a": [5, 6, 7, 8, 9, 10], "b": [1, 2, 3, 4, 5, 6]})
    (none,) = find_crossovers(summary, None, "output_tps")
    assert none.kind == "none" and none.x is None and none.winner == "a"
    assert "no crossing in range" in none.sentence and "concurrency 1-32" in none.sentence
    wavy = _summary({"a": [5, 1, 5, 1, 5, 1], "b": [3, 3, 3, 3, 3, 3]})
    results = find_crossovers(wavy, None, "output_tps")
    assert len(results) == 5 and all(r.crossings == 5 for r in results)
    assert "cross more than once" in results[0].sentence
    assert [r.winner for r in results] == ["b", "a", "b", "a", "b"]


def test_too_few_levels() -> None:
    summary = _summary({"a": [1, 2, 3, 4, 5, 6], "b": [6, 5, 4, 3, 2, 1]}).iloc[[0, 6]]
    (result,) = find_crossovers(summary, None, "output_tps")
    assert result.kind == "insufficient"


def _closed_loop_requests(name: str, latency: dict[float, float], rng: np.random.Generator,
                          rounds: int = 6) -> list[dict]:
    """Closed-loop requests: c lanes, each runs `rounds` requests back to back."""
    rows = []
    for level, mean in latency.items():
        index = 0
        for _lane in range(int(level)):
            clock = 0.0
            for _ in range(rounds):
                e2e = mean * float(rng.uniform(0.7, 1.3))
                rows.append({"topology": name, "level": level, "index": index, "instance": "u",
                             "send_time": clock, "end_time": clock + e2e, "ok": True, "status": 200,
                             "error": "", "ttft": e2e / 10, "e2e": e2e, "tpot": e2e * 0.9 / 9,
                             "itl": [e2e * 0.9 / 9] * 9, "itl_max": e2e * 0.9 / 9, "chunk_times": [],
                             "chunk_tokens": [], "input_tokens": 10, "output_tokens": 10,
                             "planned_input": 10, "planned_output": 10, "completion_id": "", "garbage": 0})
                clock += e2e
                index += 1
    return rows


def test_bootstrap_interval_covers_the_true_crossing() -> None:
    # throughput = c x 10 tokens / latency; a: latency grows fast with c, b: slow but starts higher.
    # Equal where 0.5 (1 + c/8) = 0.8 (1 + c/40): c = 0.3 / 0.0425.
    lat_a = {c: 0.5 * (1 + c / 8) for c in LEVELS}
    lat_b = {c: 0.8 * (1 + c / 40) for c in LEVELS}
    true_x = 0.3 / 0.0425
    covered, widths = 0, []
    for seed in range(10):  # fixed seeds: a coverage check, deterministic
        rng = np.random.default_rng(seed)
        rows = _closed_loop_requests("a", lat_a, rng) + _closed_loop_requests("b", lat_b, rng)
        requests = pd.DataFrame(rows)
        summary = summarize(requests, {"ttft": 1e6}, {"a": 2, "b": 2})
        (result,) = find_crossovers(summary, requests, "output_tps", slos_ms={"ttft": 1e6}, n_boot=100,
                                    seed=seed)
        assert result.kind == "crossing" and result.winner == "b"
        assert result.ci_low is not None and result.ci_high is not None and result.x is not None
        assert result.ci_low <= result.x <= result.ci_high
        assert result.support > 0.8 and "(95% CI" in result.sentence
        covered += result.ci_low <= true_x <= result.ci_high
        widths.append(result.ci_high / result.ci_low)
    assert covered >= 8  # about 92% over 40 seeds when measured
    assert float(np.median(widths)) < 2.5  # informative, not the whole range


def test_capacity_interpolates_the_attainment_curve() -> None:
    summary = _summary({"a": [1, 1, 1, 0.95, 0.5, 0.1], "b": [1, 1, 1, 1, 1, 1], "c": [0.5] * 6},
                       column="attainment")
    caps = {c.topology: c for c in max_load_meeting_objective(summary, None, 0.9)}
    capacity_a = caps["a"].x
    assert capacity_a is not None
    assert 8 < capacity_a < 16 and caps["a"].censored == ""
    assert caps["a"].per_gpu == pytest.approx(capacity_a / 4)
    assert "meets the 90% SLO objective up to concurrency about" in caps["a"].sentence
    assert caps["b"].censored == "above" and caps["b"].x == 32
    assert caps["c"].censored == "below" and caps["c"].x is None and "misses" in caps["c"].sentence


def test_capacity_interval_from_requests() -> None:
    rng = np.random.default_rng(5)
    rows = _closed_loop_requests("a", {c: 0.1 * c for c in LEVELS}, rng)
    requests = pd.DataFrame(rows)
    slos = {"e2el": 1000.0}  # e2e ~ 0.1 c s: met up to about c = 10 (with the +-30% spread)
    summary = summarize(requests, slos, {"a": 1})
    (cap,) = max_load_meeting_objective(summary, requests, 0.9, slos_ms=slos, n_boot=100)
    # true capacity: P(0.1 c U <= 1) = 0.9 with U ~ uniform(0.7, 1.3) -> c = 10 / 1.24
    assert cap.x is not None and cap.ci_low is not None and cap.ci_high is not None
    assert cap.censored == "" and 4 <= cap.x <= 16
    assert cap.ci_low <= cap.x <= cap.ci_high
    assert cap.ci_low <= 10 / 1.24 <= cap.ci_high
    assert not math.isnan(cap.ci_high)


def test_pooled_itl_bootstrap_matches_concatenating_each_resample() -> None:
    from crossover.loadgen.analysis.crossings import METRICS, _metric_replicates

    rng = np.random.default_rng(2)
    itls = [list(rng.gamma(2.0, 0.01, int(rng.integers(1, 80)))) for _ in range(60)]
    group = pd.DataFrame({"ok": [True] * 59 + [False], "itl": itls})
    indices = rng.integers(0, 60, size=(40, 60))
    fast = _metric_replicates(group, METRICS["itl_p99"], 1.0, 1, 1.0, True, indices)
    pools = [np.concatenate([itls[i] for i in row if i != 59]) for row in indices]
    naive = np.array([np.percentile(p, 99) * 1000 for p in pools])
    assert np.allclose(fast, naive, rtol=0.05)
    assert np.median(np.abs(fast - naive) / naive) < 0.01


def test_an_answer_names_the_measured_levels_either_side_of_it() -> None:
    summary = _summary({"a": [10, 20, 30, 40, 50, 60], "b": [5, 15, 35, 45, 55, 65]})
    (found,) = find_crossovers(summary, None, "output_tps")
    assert found.kind == "crossing" and 2 < (found.x or 0) < 4
    assert (found.bracket_low, found.bracket_high) == (2.0, 4.0)
    assert found.sentence.endswith("(between levels 2 and 4)"), found.sentence
    capacities = max_load_meeting_objective(
        _summary({"a": [1, 1, 1, 0.95, 0.5, 0.1], "b": [1] * 6}, column="attainment"), None, 0.9)
    assert [(c.bracket_low, c.bracket_high) for c in capacities] == [(8.0, 16.0), (None, None)]
    assert "(between levels 8 and 16)" in capacities[0].sentence
    assert bracket(LEVELS, 8.0) == (8.0, 8.0) and bracket(LEVELS, 0.5) is None


def test_a_level_whose_repeats_read_both_sides_bounds_no_answer() -> None:
    # concurrency 8 measured twice: once a leads in throughput, once b does. It lies in the
    # crossing's band, so the bracket reaches the levels either side of it that do not split.
    from crossover.loadgen.analysis.crossings import analyze, split_levels

    rng = np.random.default_rng(3)
    lat_a = {c: 0.5 * (1 + c / 8) for c in LEVELS}
    lat_b = {c: 0.8 * (1 + c / 40) for c in LEVELS}
    first = pd.DataFrame(_closed_loop_requests("a", lat_a, rng) + _closed_loop_requests("b", lat_b, rng))
    again = pd.DataFrame(_closed_loop_requests("a", {8.0: 0.5}, rng)
                         + _closed_loop_requests("b", {8.0: 1.5}, rng))
    requests = pd.concat([first.assign(repeat=1), again.assign(repeat=2)], ignore_index=True)
    slos = {"ttft": 1e6}
    summary = summarize(requests, slos, {"a": 2, "b": 2})
    found = analyze(summary, requests, mode=Mode.CLOSED, objective=0.9, slos_ms=slos, n_boot=20,
                    metrics=["output_tps"])
    (crossing,) = [c for c in found.crossovers if c.kind == "crossing"]
    assert (crossing.bracket_low, crossing.bracket_high) == (4.0, 16.0), crossing
    assert "between levels 4 and 16" in crossing.sentence
    by_repeat = pd.DataFrame({"topology": ["a", "b"] * 4, "level": [8.0] * 4 + [4.0] * 4,
                              "repeat": [1, 1, 2, 2] * 2, "x": [1, 2, 3, 2, 1, 2, 1, 2]})
    assert split_levels(by_repeat, "x", "a", "b") == {8.0}
    assert split_levels(by_repeat, "x", "a", 1.5) == {8.0}  # against a number: the objective
    assert bracket(LEVELS, 6.0, {8.0}) == (4.0, 16.0) and bracket(LEVELS, 6.0, {4.0, 2.0, 1.0}) == (1.0, 8.0)
    unsplit = analyze(summarize(first, slos, {"a": 2, "b": 2}), first, mode=Mode.CLOSED, objective=0.9,
                      slos_ms=slos, n_boot=20, metrics=["output_tps"])
    (alone,) = [c for c in unsplit.crossovers if c.kind == "crossing"]
    assert (alone.bracket_low, alone.bracket_high) == (4.0, 8.0)


def _rate_summary(curves: dict[str, dict[float, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"topology": name, "level": level, "output_tps_per_gpu": value, "gpus": 4,
                          "duration_s": 1.0}
                         for name, values in curves.items() for level, value in values.items()])


def test_topologies_measured_at_other_levels_cross_between_their_own_levels() -> None:
    # each at its own achieved rates (a GuideLLM sweep): a = 10 + 2r, b = 3.5 + 3r cross at 6.5,
    # where b was measured at 6 and 8 and a at 5 and 7
    a = {r: 10 + 2 * r for r in (1.0, 3.0, 5.0, 7.0, 9.0)}
    b = {r: 3.5 + 3 * r for r in (2.0, 4.0, 6.0, 8.0, 10.0)}
    (found,) = find_crossovers(_rate_summary({"a": a, "b": b}), None, "output_tps", mode=Mode.OPEN)
    assert found.kind == "crossing" and found.winner == "b"
    assert found.x == pytest.approx(6.5, rel=1e-9)
    assert found.level_range == (2.0, 9.0)  # the union of levels inside both ranges
    # either curve may step anywhere between its own levels: the bracket reaches to both
    assert (found.bracket_low, found.bracket_high) == (5.0, 8.0)
    assert found.sentence.endswith("(between levels 5 and 8)"), found.sentence
    # ranges that overlap at fewer than two levels still give no crossing
    (apart,) = find_crossovers(_rate_summary({"a": {1.0: 1, 2.0: 2}, "b": {2.0: 3, 3.0: 4}}), None,
                               "output_tps", mode=Mode.OPEN)
    assert apart.kind == "insufficient"


def test_a_bootstrap_over_other_levels_interpolates_each_replicate() -> None:
    # the closed-loop pair of the coverage test, b measured only between a's levels
    lat_a = {c: 0.5 * (1 + c / 8) for c in LEVELS}
    lat_b = {c: 0.8 * (1 + c / 40) for c in (1.5, 3.0, 6.0, 12.0, 24.0)}
    rng = np.random.default_rng(1)
    requests = pd.DataFrame(_closed_loop_requests("a", lat_a, rng) + _closed_loop_requests("b", lat_b, rng))
    summary = summarize(requests, {"ttft": 1e6}, {"a": 2, "b": 2})
    (result,) = find_crossovers(summary, requests, "output_tps", slos_ms={"ttft": 1e6}, n_boot=100, seed=1)
    assert result.kind == "crossing" and result.winner == "b" and result.x is not None
    assert result.ci_low is not None and result.ci_high is not None
    assert result.ci_low <= 0.3 / 0.0425 <= result.ci_high and result.support > 0.8
    assert (result.bracket_low, result.bracket_high) == (4.0, 12.0)  # a saw 4 and 8, b 6 and 12


def test_shared_levels_give_exactly_what_they_gave_before_other_levels_were_compared() -> None:
    # pinned from crossings.py as of bb9bf71 (before Curves): topologies measured at the same
    # levels are compared as measured, bootstrap and all, to the last bit
    lat_a = {c: 0.5 * (1 + c / 8) for c in LEVELS}
    lat_b = {c: 0.8 * (1 + c / 40) for c in LEVELS}
    rng = np.random.default_rng(3)
    requests = pd.DataFrame(_closed_loop_requests("a", lat_a, rng) + _closed_loop_requests("b", lat_b, rng))
    summary = summarize(requests, {"ttft": 1e6}, {"a": 2, "b": 2})
    pinned = {"output_tps": (5.969905570511821, 4.896349010356934, 6.906903864611949),
              "ttft_p99": (6.678947021506517, 5.476109431334745, 6.939841649980741)}
    for metric, (x, low, high) in pinned.items():
        (found,) = find_crossovers(summary, requests, metric, slos_ms={"ttft": 1e6}, n_boot=50, seed=3)
        assert (found.x, found.ci_low, found.ci_high, found.support) == (x, low, high, 1.0)
        assert (found.bracket_low, found.bracket_high) == (4.0, 8.0)
