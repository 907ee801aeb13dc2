"""Prometheus's `histogram_quantile` and the bucket fraction behind a latency SLO, on plain numbers.

Kept in its own small module so that the app, the sweep and the rules tests compute quantiles and
SLO attainment exactly the way Prometheus (and this exporter) do.

Buckets are `(upper_bound, cumulative_count)` pairs; the list must contain the `+Inf` bucket, as a
classic Prometheus histogram does. Order does not matter (they are sorted here).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

Bucket = tuple[float, float]  # (upper bound `le`, cumulative count)

NAN = float("nan")
INF = float("inf")


def _prepared(buckets: Iterable[Bucket]) -> list[list[float]] | None:
    """Sorted, coalesced (equal bounds summed) and made monotonic, as promql/quantile.go does;
    None where Prometheus answers NaN (no +Inf bucket)."""
    ordered = sorted(buckets, key=lambda b: b[0])
    if not ordered or not math.isinf(ordered[-1][0]) or ordered[-1][0] < 0:
        return None
    merged: list[list[float]] = []
    for bound, count in ordered:
        if merged and merged[-1][0] == bound:
            merged[-1][1] += count
        else:
            merged.append([bound, count])
    # ensureMonotonic: a later bucket never counts fewer than an earlier one (float noise, or
    # series summed across targets that expose different layouts).
    highest = -INF
    for bucket in merged:
        if bucket[1] > highest:
            highest = bucket[1]
        elif bucket[1] < highest:
            bucket[1] = highest
    return merged


def _divide(numerator: float, denominator: float) -> float:
    """Go's float division: x/0 is +-Inf, 0/0 is NaN (Python would raise)."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return NAN
        return math.copysign(INF, numerator)
    return numerator / denominator


def histogram_quantile(q: float, buckets: Iterable[Bucket]) -> float:
    """The q-quantile exactly as PromQL's histogram_quantile computes it for classic buckets.

    Linear interpolation inside the bucket holding the rank; the lowest bucket starts at 0 when its
    upper bound is positive; a rank in the +Inf bucket answers the highest finite bound; NaN with
    no observations, fewer than two buckets or no +Inf bucket; -Inf/+Inf for q outside [0, 1].
    """
    if math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    prepared = _prepared(buckets)
    if prepared is None or len(prepared) < 2:
        return NAN
    observations = prepared[-1][1]
    if observations == 0 or math.isnan(observations):
        return NAN
    rank = q * observations
    # sort.Search(len(buckets)-1, count >= rank): the first bucket reaching the rank, +Inf excluded.
    index = len(prepared) - 1
    for i in range(len(prepared) - 1):
        if prepared[i][1] >= rank:
            index = i
            break
    if index == len(prepared) - 1:
        return prepared[-2][0]
    if index == 0 and prepared[0][0] <= 0:
        return prepared[0][0]
    bucket_start = 0.0
    bucket_end = prepared[index][0]
    count = prepared[index][1]
    if index > 0:
        bucket_start = prepared[index - 1][0]
        count -= prepared[index - 1][1]
        rank -= prepared[index - 1][1]
    return bucket_start + (bucket_end - bucket_start) * _divide(rank, count)


@dataclass(frozen=True)
class Fraction:
    """Share of observations at or below a threshold, and whether that share is exact."""

    value: float
    exact: bool


def bucket_fraction(threshold: float, buckets: Iterable[Bucket], count: float | None = None) -> Fraction:
    """Share of observations <= threshold: bucket{le=threshold}/count, exact on a bucket boundary.

    Off a boundary the cumulative count is interpolated linearly between the neighbouring bounds
    (from 0 below the lowest positive bound) and marked inexact; above the highest finite bound the
    +Inf bucket says nothing about where the observations lie, so the highest finite bucket's
    share is returned (a lower bound), also inexact. `count` defaults to the +Inf bucket; pass the
    histogram's `_count` to match `bucket / _count` queries. NaN when there are no observations.
    """
    prepared = _prepared(buckets)
    if prepared is None:
        return Fraction(NAN, False)
    total = prepared[-1][1] if count is None else count
    if total == 0 or math.isnan(total):
        return Fraction(NAN, True)
    finite = prepared[:-1]
    for i, (bound, cumulative) in enumerate(finite):
        if math.isclose(bound, threshold, rel_tol=1e-9, abs_tol=0.0):
            return Fraction(cumulative / total, True)
        if bound > threshold:
            lower_bound, lower_count = (finite[i - 1][0], finite[i - 1][1]) if i > 0 else (0.0, 0.0)
            if i == 0 and bound <= 0:
                return Fraction(0.0, False)
            share = (threshold - lower_bound) / (bound - lower_bound)
            interpolated = lower_count + (cumulative - lower_count) * max(0.0, share)
            return Fraction(interpolated / total, False)
    if not finite:
        return Fraction(NAN, False)
    return Fraction(finite[-1][1] / total, False)


def joint_bounds(fractions: Iterable[float]) -> tuple[float, float]:
    """Fréchet bounds on the share meeting every SLO, knowing only each SLO's share:
    max(0, sum(a_i) - (n - 1)) <= joint <= min(a_i). NaN bounds if any share is NaN or none given."""
    values = list(fractions)
    if not values or any(math.isnan(v) for v in values):
        return NAN, NAN
    lower = max(0.0, sum(values) - (len(values) - 1))
    return lower, min(values)
