"""Prometheus's `histogram_quantile` and the bucket fraction behind a latency SLO, on plain numbers.

Kept in its own small module so that the app, the sweep and the rules tests compute quantiles and
SLO attainment exactly the way Prometheus (and this exporter) do.

Buckets are `(upper_bound, cumulative_count)` pairs; the list must contain the `+Inf` bucket, as a
classic Prometheus histogram does. Order does not matter (they are sorted here).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from crossover.slo import boundary_index

Bucket = tuple[float, float]  # (upper bound `le`, cumulative count)

NAN = float("nan")
INF = float("inf")


@dataclass(frozen=True)
class Prepared:
    """Buckets as promql/quantile.go prepares them: sorted by bound, equal bounds coalesced, counts
    made monotonic. Prepare once, then ask several quantiles and fractions."""

    bounds: tuple[float, ...]
    counts: tuple[float, ...]


def prepare(buckets: Iterable[Bucket]) -> Prepared | None:
    """None where Prometheus answers NaN whatever the quantile: no +Inf bucket, or fewer than two."""
    ordered = sorted(buckets, key=_bound)
    if len(ordered) < 2 or ordered[-1][0] != INF:
        return None
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in ordered:
        if bounds and bounds[-1] == bound:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)
    if len(bounds) < 2:
        return None
    # ensureMonotonic: a later bucket never counts fewer than an earlier one (float noise, or
    # series summed across targets that expose different layouts).
    highest = -INF
    for i, count in enumerate(counts):
        if count > highest:
            highest = count
        elif count < highest:
            counts[i] = highest
    return Prepared(tuple(bounds), tuple(counts))


def _bound(bucket: Bucket) -> float:
    return bucket[0]


def _divide(numerator: float, denominator: float) -> float:
    """Go's float division: x/0 is +-Inf, 0/0 is NaN (Python would raise)."""
    if denominator == 0:
        if numerator == 0 or math.isnan(numerator):
            return NAN
        return math.copysign(INF, numerator)
    return numerator / denominator


def quantile_of(q: float, prepared: Prepared | None) -> float:
    """histogram_quantile on prepared buckets."""
    if math.isnan(q):
        return NAN
    if q < 0:
        return -INF
    if q > 1:
        return INF
    if prepared is None:
        return NAN
    bounds, counts = prepared.bounds, prepared.counts
    observations = counts[-1]
    if observations == 0 or math.isnan(observations):
        return NAN
    rank = q * observations
    # sort.Search(len(buckets)-1, count >= rank): the first bucket reaching the rank, +Inf excluded
    # (counts are monotonic, so a bisection finds it).
    last = len(counts) - 1
    index = bisect.bisect_left(counts, rank, 0, last)
    if index == last:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    bucket_start = 0.0
    bucket_end = bounds[index]
    count = counts[index]
    if index > 0:
        bucket_start = bounds[index - 1]
        count -= counts[index - 1]
        rank -= counts[index - 1]
    return bucket_start + (bucket_end - bucket_start) * _divide(rank, count)


def histogram_quantile(q: float, buckets: Iterable[Bucket]) -> float:
    """The q-quantile exactly as PromQL's histogram_quantile computes it for classic buckets.

    Linear interpolation inside the bucket holding the rank; the lowest bucket starts at 0 when its
    upper bound is positive; a rank in the +Inf bucket answers the highest finite bound; NaN with
    no observations, fewer than two buckets or no +Inf bucket; -Inf/+Inf for q outside [0, 1].
    """
    return quantile_of(q, prepare(buckets) if 0 <= q <= 1 else None) if not math.isnan(q) else NAN


@dataclass(frozen=True)
class Fraction:
    """Share of observations at or below a threshold, and whether that share is exact."""

    value: float
    exact: bool


def fraction_of(threshold: float, prepared: Prepared | None, count: float | None = None) -> Fraction:
    """bucket_fraction on prepared buckets."""
    if prepared is None:
        return Fraction(NAN, False)
    bounds, counts = prepared.bounds, prepared.counts
    total = counts[-1] if count is None else count
    if total == 0 or math.isnan(total):
        return Fraction(NAN, True)
    finite = len(bounds) - 1
    index = bisect.bisect_left(bounds, threshold, 0, finite)
    boundary = boundary_index(threshold, bounds)
    if boundary is not None:
        return Fraction(counts[boundary] / total, True)
    if index == finite:  # above the highest finite bound: only a lower bound is known
        return Fraction(counts[finite - 1] / total, False)
    if index == 0 and bounds[0] <= 0:
        return Fraction(0.0, False)
    lower_bound, lower_count = (bounds[index - 1], counts[index - 1]) if index > 0 else (0.0, 0.0)
    share = (threshold - lower_bound) / (bounds[index] - lower_bound)
    interpolated = lower_count + (counts[index] - lower_count) * max(0.0, share)
    return Fraction(interpolated / total, False)


def bucket_fraction(threshold: float, buckets: Iterable[Bucket], count: float | None = None) -> Fraction:
    """Share of observations <= threshold: bucket{le=threshold}/count, exact on a bucket boundary.

    Off a boundary the cumulative count is interpolated linearly between the neighbouring bounds
    (from 0 below the lowest positive bound) and marked inexact; above the highest finite bound the
    +Inf bucket says nothing about where the observations lie, so the highest finite bucket's
    share is returned (a lower bound), also inexact. `count` defaults to the +Inf bucket; pass the
    histogram's `_count` to match `bucket / _count` queries. NaN when there are no observations.
    """
    return fraction_of(threshold, prepare(buckets), count)


