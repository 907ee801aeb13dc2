"""histogram_quantile, bucket fractions and joint bounds on hand-checked numbers.

The same functions are compared with a real Prometheus in test_exporter_prometheus.py."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover.exporter.quantile import bucket_fraction, histogram_quantile

INF = math.inf
# 10 observations: 2 in (0, 0.1], 6 in (0.1, 0.5], 2 in (0.5, 1].
BUCKETS = [(0.1, 2.0), (0.5, 8.0), (1.0, 10.0), (INF, 10.0)]


def test_interpolates_inside_the_bucket_holding_the_rank():
    # rank 5 falls in (0.1, 0.5] which holds 6, 3 of them below the rank: 0.1 + 0.4 * 3/6.
    assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.3)
    assert histogram_quantile(0.9, BUCKETS) == pytest.approx(0.75)


def test_lowest_bucket_starts_at_zero():
    assert histogram_quantile(0.1, BUCKETS) == pytest.approx(0.05)


def test_rank_in_the_inf_bucket_answers_the_highest_finite_bound():
    buckets = [(0.1, 2.0), (1.0, 5.0), (INF, 10.0)]
    assert histogram_quantile(0.99, buckets) == 1.0


def test_no_observations_is_nan_and_q_outside_0_1_is_infinite():
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0.0), (INF, 0.0)]))
    assert histogram_quantile(-0.1, BUCKETS) == -INF
    assert histogram_quantile(1.1, BUCKETS) == INF
    assert math.isnan(histogram_quantile(math.nan, BUCKETS))


def test_without_an_inf_bucket_or_with_one_bucket_is_nan():
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1.0), (1.0, 2.0)]))
    assert math.isnan(histogram_quantile(0.5, [(INF, 2.0)]))


def test_lowest_bound_at_or_below_zero_is_returned_as_is():
    assert histogram_quantile(0.1, [(0.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == 0.0
    assert histogram_quantile(0.1, [(-1.0, 5.0), (1.0, 10.0), (INF, 10.0)]) == -1.0


def test_order_does_not_matter_and_equal_bounds_are_coalesced():
    shuffled = [BUCKETS[2], BUCKETS[0], BUCKETS[3], BUCKETS[1]]
    assert histogram_quantile(0.5, shuffled) == histogram_quantile(0.5, BUCKETS)
    split = [(0.1, 1.0), (0.1, 1.0), (0.5, 4.0), (0.5, 4.0), (1.0, 10.0), (INF, 10.0)]
    assert histogram_quantile(0.5, split) == pytest.approx(0.3)


def test_monotonicity_is_enforced():
    # The 0.5 bucket dips below 0.1's (e.g. summed across targets with different layouts): it is
    # raised to 4, so rank 5 lies in (0.5, 1] holding 6: 0.5 + 0.5 * 1/6.
    broken = [(0.1, 4.0), (0.5, 3.0), (1.0, 10.0), (INF, 10.0)]
    assert histogram_quantile(0.5, broken) == pytest.approx(0.5 + 0.5 / 6)


def test_empty_bucket_holding_rank_zero_is_nan_as_in_go():
    assert math.isnan(histogram_quantile(0.0, [(0.1, 0.0), (1.0, 5.0), (INF, 5.0)]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=12),
       st.floats(min_value=0.0, max_value=1.0))
def test_quantile_lies_within_the_finite_bounds(per_bucket, q):
    bounds = [0.01 * 2**i for i in range(len(per_bucket))]
    cumulative = 0.0
    buckets = []
    for bound, count in zip(bounds, per_bucket, strict=True):
        cumulative += count
        buckets.append((bound, cumulative))
    buckets.append((INF, cumulative))
    value = histogram_quantile(q, buckets)
    if cumulative == 0:
        assert math.isnan(value)
    elif not math.isnan(value):
        assert 0.0 <= value <= bounds[-1]


def test_fraction_is_exact_on_a_boundary_and_uses_the_given_count():
    assert bucket_fraction(0.5, BUCKETS).value == pytest.approx(0.8)
    assert bucket_fraction(0.5, BUCKETS).exact
    assert bucket_fraction(0.5, BUCKETS, count=16.0).value == pytest.approx(0.5)


def test_fraction_off_a_boundary_is_interpolated_and_inexact():
    fraction = bucket_fraction(0.3, BUCKETS)
    assert fraction.value == pytest.approx((2 + 6 * 0.5) / 10)
    assert not fraction.exact
    below = bucket_fraction(0.05, BUCKETS)
    assert below.value == pytest.approx(0.1) and not below.exact


def test_fraction_above_the_highest_bound_is_a_lower_bound():
    buckets = [(0.1, 2.0), (1.0, 5.0), (INF, 10.0)]
    fraction = bucket_fraction(3.0, buckets)
    assert fraction.value == pytest.approx(0.5) and not fraction.exact


def test_fraction_without_observations_is_nan():
    assert math.isnan(bucket_fraction(0.5, [(0.5, 0.0), (INF, 0.0)]).value)

