"""The SLO module: outcomes, attainment and the client-side rules every part reads."""

from __future__ import annotations

import math

import pytest

from crossover import slo


def test_outcomes_split_what_was_served_from_every_failure():
    found = slo.outcomes({"stop": 6.0, "length": 2.0, "abort": 1.0, "error": 1.0}, rejections=2.0,
                         requests=15.0)
    assert found.served == 8.0
    assert found.failed == {"abort": 1.0, "error": 1.0, "rejected": 2.0, "unfinished": 3.0}
    assert found.total == 15.0 and found.failed_finished == 2.0
    assert found.served_share == pytest.approx(8 / 15)


def test_counters_read_a_moment_apart_never_give_negative_unfinished_requests():
    found = slo.outcomes({"stop": 10.0}, rejections=None, requests=9.5)
    assert found.failed == {"unfinished": 0.0} and found.total == 10.0


def test_attainment_scales_the_histogram_share_by_the_share_served():
    found = slo.outcomes({"stop": 5.0, "error": 5.0}, rejections=0.0, requests=10.0)
    assert slo.attainment("ttft", 0.8, 5.0, found) == pytest.approx(0.4)
    # e2e and TPOT observed the 5 errors too: within 9 of 10 observations, minus the 5 failed
    assert slo.attainment("e2el", 0.9, 10.0, found) == pytest.approx(4 / 10)


def test_nothing_served_is_zero_and_no_traffic_is_nan():
    failed = slo.outcomes({"stop": 0.0, "error": 3.0}, rejections=1.0, requests=4.0)
    assert slo.attainment("ttft", math.nan, 0.0, failed) == 0.0
    idle = slo.outcomes({"stop": 0.0}, rejections=0.0, requests=0.0)
    assert math.isnan(slo.attainment("ttft", math.nan, 0.0, idle))


def test_without_finished_reason_attainment_falls_back_to_the_histogram_share():
    old = slo.outcomes({}, rejections=None, requests=None)
    assert not old.counted and old.served_share == 1.0
    assert slo.attainment("tpot", 0.7, 10.0, old) == 0.7


def test_joint_bounds_and_goodput():
    lower, upper = slo.joint_bounds([0.9, 0.8])
    assert (lower, upper) == (pytest.approx(0.7), 0.8)
    assert slo.goodput(10.0, lower) == pytest.approx(7.0)
    assert all(math.isnan(b) for b in slo.joint_bounds([]))
    assert all(math.isnan(b) for b in slo.joint_bounds([0.9, math.nan]))
    assert slo.joint_bounds([0.3, 0.4]) == (0.0, 0.3)
    assert slo.joint_bounds([0.9, 0.9, 0.9]) == pytest.approx((0.7, 0.9))
    assert slo.joint_slos(["itl", "e2el", "ttft"]) == ("ttft", "e2el")


def test_client_errors_are_not_the_fleets_but_timeouts_and_throttles_are():
    assert slo.is_client_error(400) and slo.is_client_error(404)
    assert not slo.is_client_error(429) and not slo.is_client_error(408) and not slo.is_client_error(503)
    assert slo.is_fleet_request("/v1/completions", "5xx")
    assert not slo.is_fleet_request("/v1/completions", "4xx")
    assert not slo.is_fleet_request("/v1/models", "2xx")


def test_names_keep_one_word_per_idea():
    assert slo.attainment_column() == "attainment" and slo.attainment_column("ttft") == "attainment_ttft"
    assert slo.GOODPUT_REQUESTS == "goodput_requests_per_second"
    assert slo.GOODPUT_TOKENS == "goodput_tokens_per_second"
    assert [slo.percentile_label(q) for q in slo.QUANTILES] == ["p50", "p90", "p99"]
    assert set(slo.SLO_HISTOGRAMS) == set(slo.SLO_KINDS) and set(slo.PER_REQUEST_SLOS) < set(slo.SLO_KINDS)


def test_interactivity_is_one_users_decode_rate() -> None:
    assert slo.interactivity(0.02) == 50.0
    assert slo.interactivity(0.0) == float("inf")


def test_pareto_front_keeps_the_points_no_other_beats_on_both_axes() -> None:
    nan = float("nan")
    points = [(1, 10), (2, 5), (3, 1), (2, 4), (1, 10), (nan, 1), (0.5, 11)]
    assert slo.pareto_front(points) == [6, 0, 1, 2]
    assert slo.pareto_front([]) == []


def test_knee_is_the_last_level_worth_its_step() -> None:
    # 100 -> 180 (+80%) -> 190 (+5.6%, interactivity falls): the knee is the second level.
    assert slo.knee([(100.0, 50.0), (180.0, 40.0), (190.0, 20.0), (195.0, 10.0)]) == 1
    # A small gain with interactivity rising is no knee (the curve did not trade anything).
    assert slo.knee([(100.0, 50.0), (105.0, 55.0), (200.0, 30.0)]) is None
    # Still gaining more than KNEE_GAIN at every step: not bent in the range.
    assert slo.knee([(100.0, 50.0), (150.0, 40.0), (200.0, 30.0)]) is None
    # NaN levels are stepped over.
    assert slo.knee([(100.0, 50.0), (float("nan"), 45.0), (101.0, 40.0)]) == 0
    assert slo.knee([]) is None


def test_tpot_is_the_decode_time_over_the_tokens_after_the_first() -> None:
    assert slo.tpot(0.3, 4) == pytest.approx(0.1)
    assert slo.tpot(0.0, 1) == 0.0 and slo.tpot(0.5, 0) == 0.0
