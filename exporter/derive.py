"""Per-window derivations for a group of targets (one instance, one P/D role, or a whole topology).

Pure functions on plain data: `derive(windows, ...)` takes each target's `SeriesWindow` and returns
a `Derived`. Groups are summed the way PromQL's `sum by (le) (increase(...))` sums them: counters
and buckets first, then quantiles and ratios from the sums (never averaged ratios).

Conventions: a family that no target of the group exposes gives None (an absent series, never a
zero); a family that is exposed but saw no observations in the window gives NaN for quantiles,
means and ratios (what Prometheus answers) and 0 for rates.
"""

from __future__ import annotations

import bisect
import functools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from crossover import catalog, slo
from crossover.exporter.parse import SeriesKey
from crossover.exporter.quantile import Prepared, fraction_of, prepare_sorted, quantile_of
from crossover.exporter.window import SeriesWindow
from crossover.slo import QUANTILES, SLO_HISTOGRAMS, quantile_label

K = TypeVar("K")

_QUANTILE_LABELS: tuple[tuple[float, str], ...] = tuple((q, quantile_label(q)) for q in QUANTILES)


@dataclass(frozen=True)
class Latency:
    """Quantiles (seconds, histogram_quantile) and mean (sum/count) over the window."""

    quantiles: dict[str, float]  # quantile_label(q) -> seconds
    mean: float
    observations: float


@dataclass(frozen=True)
class SloAttainment:
    """Share of requests served within one SLO (crossover.slo): the histogram's share within the
    threshold, increase(bucket{le=threshold}) / increase(count), times the share served."""

    threshold_seconds: float
    ratio: float
    exact: bool  # False when the threshold is not a bucket boundary (interpolated)


def _attainment(kind: str, threshold: float, within: float, exact: bool, observed: float,
                outcomes: slo.Outcomes) -> SloAttainment:
    return SloAttainment(threshold, slo.attainment(kind, within, observed, outcomes), exact)


@dataclass(frozen=True)
class KvTransfer:
    """KV-cache transfers (P/D), from the catalog's families of any KV connector."""

    time: Latency | None
    transfers_per_second: float | None
    bytes_per_second: float | None
    bytes_per_transfer_second: float | None  # bytes moved per second of transfer time
    failures_per_second: float | None


@dataclass(frozen=True)
class Derived:
    """Everything derived for one group over one window. None: no target exposes the family."""

    window_seconds: float
    targets: int  # targets with a window (at least two scrapes in it)
    gpus: int
    latency: dict[str, Latency] = field(default_factory=dict)  # "ttft", "tpot", "itl", "e2el"
    prompt_tokens_per_second: float | None = None
    generation_tokens_per_second: float | None = None
    requests_per_second: float | None = None
    requests_per_second_by_reason: dict[str, float] = field(default_factory=dict)
    failed_requests_per_second: dict[str, float] = field(default_factory=dict)  # slo.FAILURE_REASONS
    failures_counted: bool | None = None  # None: no requests counter; False: histogram-only fallback
    kv_cache_usage_max: float | None = None
    kv_cache_usage_mean: float | None = None
    running: float | None = None  # mean over the window, summed over targets
    waiting: float | None = None
    preemptions_per_second: float | None = None
    attainment: dict[str, SloAttainment] = field(default_factory=dict)  # SLO name -> attainment
    joint_slos: tuple[str, ...] = ()
    attainment_lower: float | None = None  # every joint SLO met: Fréchet bounds
    attainment_upper: float | None = None
    goodput_requests_per_second_lower: float | None = None
    goodput_requests_per_second_upper: float | None = None
    goodput_tokens_per_second_lower: float | None = None
    goodput_tokens_per_second_upper: float | None = None
    kv_transfer: KvTransfer | None = None
    # Topologies only: where the request figures come from (crossover.spec.REQUEST_SOURCES).
    requests_source: str | None = None

    def per_gpu(self, value: float | None) -> float | None:
        # An entrypoint group holds no GPUs: no per-GPU figure rather than a division by zero.
        return None if value is None or not self.gpus else value / self.gpus

    @property
    def prompt_tokens_per_second_per_gpu(self) -> float | None:
        return self.per_gpu(self.prompt_tokens_per_second)

    @property
    def generation_tokens_per_second_per_gpu(self) -> float | None:
        return self.per_gpu(self.generation_tokens_per_second)

    @property
    def requests_per_second_per_gpu(self) -> float | None:
        return self.per_gpu(self.requests_per_second)

    @property
    def goodput_tokens_per_second_per_gpu_lower(self) -> float | None:
        return self.per_gpu(self.goodput_tokens_per_second_lower)

    @property
    def goodput_tokens_per_second_per_gpu_upper(self) -> float | None:
        return self.per_gpu(self.goodput_tokens_per_second_upper)


# --- reading series keys ------------------------------------------------------------------------------
@dataclass(frozen=True)
class _KeyInfo:
    family: str
    suffix: str
    le: float | None
    reason: str | None


@lru_cache(maxsize=65536)
def _key_info(key: SeriesKey) -> _KeyInfo | None:
    found = catalog.CATALOG.family_of_sample(key[0])
    if found is None:
        return None
    metric, suffix = found
    if metric is catalog.HTTP_REQUESTS:
        # Only the fleet's requests: the serving handlers without client errors (crossover.slo).
        labels = dict(key[1])
        if not slo.is_fleet_request(labels.get("handler", ""), labels.get("status", "")):
            return None
    le: float | None = None
    reason: str | None = None
    for name, value in key[1]:
        if name == "le" and suffix == "_bucket":
            try:
                le = float(value)
            except ValueError:
                return None
        elif name == "finished_reason":
            reason = value
    if suffix == "_bucket" and le is None:
        return None
    return _KeyInfo(metric.name, suffix, le, reason)


@dataclass
class _Histogram:
    """Summed bucket increases: `counts[i]` observations at or below `bounds[i]` (sorted, distinct)."""

    bounds: tuple[float, ...]
    counts: list[float]
    total: float = 0.0
    count: float = 0.0
    has_count: bool = False
    _prepared: Prepared | None = None
    _is_prepared: bool = False

    def prepared(self) -> Prepared | None:
        """Sorted, monotonic buckets, computed once for all quantiles and fractions."""
        if not self._is_prepared:
            self._prepared = prepare_sorted(self.bounds, self.counts)
            self._is_prepared = True
        return self._prepared

    def add(self, other: _Histogram) -> None:
        if other.bounds is self.bounds or other.bounds == self.bounds:
            self.counts = list(map(operator.add, self.counts, other.counts))
        else:  # different layouts (e.g. --custom-histogram-buckets on one target): the union
            merged = dict(zip(self.bounds, self.counts, strict=True))
            for bound, count in zip(other.bounds, other.counts, strict=True):
                merged[bound] = merged.get(bound, 0.0) + count
            self.bounds = tuple(sorted(merged))
            self.counts = [merged[b] for b in self.bounds]
        self.total += other.total
        self.count += other.count
        self.has_count = self.has_count or other.has_count
        self._is_prepared = False

    def copy(self) -> _Histogram:
        return _Histogram(self.bounds, list(self.counts), self.total, self.count, self.has_count)


@dataclass
class WindowSums:
    """One target's (or a merged group's) window, reduced to what derivation needs: summed
    histogram increases, per-second rates (each target's increase over its own window length),
    and gauge statistics. Summarise each target once, then merge for every group it belongs to."""

    targets: int = 0
    histograms: dict[str, _Histogram] = field(default_factory=dict)
    rates: dict[str, float] = field(default_factory=dict)  # counter family -> per second
    reason_rates: dict[str, float] = field(default_factory=dict)  # finished_reason -> per second
    hist_rates: dict[str, float] = field(default_factory=dict)  # family + "_sum"/"_count" -> per second
    gauge_mean_sum: dict[str, float] = field(default_factory=dict)  # sum over targets of window means
    gauge_max: dict[str, float] = field(default_factory=dict)
    gauge_target_means: dict[str, list[float]] = field(default_factory=dict)


@dataclass(frozen=True)
class _HistogramColumns:
    bounds: tuple[float, ...]  # distinct `le` values, sorted
    buckets: list[tuple[int, int]]  # (slot in bounds, column) of each bucket series
    direct: list[int] | None  # columns in bounds order when each bound has exactly one series
    sums: list[int]
    counts: list[int]


@dataclass(frozen=True)
class _Layout:
    """Where each family's series sit in a target's keys; built once per keys tuple."""

    histograms: dict[str, _HistogramColumns]
    counters: dict[str, list[int]]
    reasons: dict[str, list[int]]  # finished_reason -> columns
    gauges: dict[str, list[int]]


def _build_layout(keys: tuple[SeriesKey, ...]) -> _Layout:
    buckets: dict[str, list[tuple[int, float]]] = {}
    sums: dict[str, list[int]] = {}
    counts: dict[str, list[int]] = {}
    counters: dict[str, list[int]] = {}
    reasons: dict[str, list[int]] = {}
    gauges: dict[str, list[int]] = {}
    for column, key in enumerate(keys):
        info = _key_info(key)
        if info is None:
            continue
        if info.suffix == "_bucket":
            assert info.le is not None
            buckets.setdefault(info.family, []).append((column, info.le))
        elif info.suffix == "_sum":
            sums.setdefault(info.family, []).append(column)
        elif info.suffix == "_count":
            counts.setdefault(info.family, []).append(column)
        elif info.suffix == "_total":
            counters.setdefault(info.family, []).append(column)
            if info.reason is not None:
                reasons.setdefault(info.reason, []).append(column)
        else:
            gauges.setdefault(info.family, []).append(column)
    histograms = {}
    for family in buckets.keys() | sums.keys() | counts.keys():
        pairs = buckets.get(family, [])
        bounds = tuple(sorted({le for _, le in pairs}))
        slot = {le: i for i, le in enumerate(bounds)}
        direct = None
        if len(pairs) == len(bounds):
            direct = [column for column, _ in sorted(pairs, key=lambda p: p[1])]
        histograms[family] = _HistogramColumns(bounds, [(slot[le], column) for column, le in pairs], direct,
                                               sums.get(family, []), counts.get(family, []))
    return _Layout(histograms, counters, reasons, gauges)


_LAYOUTS: dict[int, tuple[tuple[SeriesKey, ...], _Layout]] = {}


def _layout(keys: tuple[SeriesKey, ...]) -> _Layout:
    """The layout of a keys tuple; scrapes of an unchanged target share one tuple, so this is a
    dictionary lookup by identity on the hot path."""
    cached = _LAYOUTS.get(id(keys))
    if cached is not None and cached[0] is keys:
        return cached[1]
    layout = _build_layout(keys)
    if len(_LAYOUTS) > 8192:
        _LAYOUTS.clear()
    _LAYOUTS[id(keys)] = (keys, layout)
    return layout


def layout_of(keys: tuple[SeriesKey, ...]) -> _Layout:
    """Where each family's series sit in a keys tuple (cached per tuple)."""
    return _layout(keys)


def _total(values: list[float], columns: list[int]) -> float:
    if len(columns) == 1:
        return values[columns[0]]
    return math.fsum([values[c] for c in columns])


def window_sums(window: SeriesWindow) -> WindowSums:
    """Reduce one target's window (all its engines and label sets summed). Plain lists, not numpy:
    a target has about a hundred series, where a numpy call costs more than the arithmetic."""
    layout = _layout(window.keys)
    increase: list[float] = window.increase_values.tolist()
    # In a window whose scrapes all had the same series (the usual case) every series counts.
    counted: list[bool] | None = None if window.complete else window.counted.tolist()
    duration = window.duration
    per_second = 1.0 / duration if duration > 0 else math.nan
    sums = WindowSums(targets=1)
    for family, columns in layout.histograms.items():
        if counted is not None and not (any(counted[c] for _, c in columns.buckets)
                                        or any(counted[c] for c in columns.counts)):
            continue  # the series exist but none was seen twice in the window
        if columns.direct is not None:
            values = [increase[c] for c in columns.direct]
        else:
            values = [0.0] * len(columns.bounds)
            for slot, column in columns.buckets:
                values[slot] += increase[column]
        total = _total(increase, columns.sums)
        count = _total(increase, columns.counts)
        sums.histograms[family] = _Histogram(columns.bounds, values, total, count, bool(columns.counts))
        if duration > 0:
            if columns.sums:
                sums.hist_rates[family + "_sum"] = total * per_second
            if columns.counts:
                sums.hist_rates[family + "_count"] = count * per_second
    for family, cols in layout.counters.items():
        if counted is None or any(counted[c] for c in cols):
            sums.rates[family] = _total(increase, cols) * per_second
    for reason, cols in layout.reasons.items():
        if counted is None or any(counted[c] for c in cols):
            sums.reason_rates[reason] = _total(increase, cols) * per_second
    if layout.gauges:
        gauge: list[bool] | None = None if window.complete else window.gauge.tolist()
        means: list[float] = window.mean_values.tolist()
        highest: list[float] = window.highest_values.tolist()
        for family, cols in layout.gauges.items():
            if gauge is not None and not all(gauge[c] for c in cols):
                continue
            mean_sum = _total(means, cols)
            sums.gauge_mean_sum[family] = mean_sum
            sums.gauge_target_means[family] = [mean_sum / len(cols)]
            sums.gauge_max[family] = max([highest[c] for c in cols])
    return sums


def _add(into: dict[K, float], other: Mapping[K, float]) -> None:
    for key, value in other.items():
        into[key] = into.get(key, 0.0) + value


def merge(parts: Iterable[WindowSums]) -> WindowSums:
    """Sum several targets' WindowSums (counters and buckets add; maxima take the max). A single
    part is returned as it is (WindowSums are not changed once built)."""
    items = list(parts)
    if len(items) == 1:
        return items[0]
    out = WindowSums()
    for part in items:
        out.targets += part.targets
        for family, histogram in part.histograms.items():
            mine = out.histograms.get(family)
            if mine is None:
                out.histograms[family] = histogram.copy()
            else:
                mine.add(histogram)
        _add(out.rates, part.rates)
        _add(out.reason_rates, part.reason_rates)
        _add(out.hist_rates, part.hist_rates)
        _add(out.gauge_mean_sum, part.gauge_mean_sum)
        for family, highest in part.gauge_max.items():
            out.gauge_max[family] = max(out.gauge_max.get(family, -math.inf), highest)
        for family, means in part.gauge_target_means.items():
            out.gauge_target_means.setdefault(family, []).extend(means)
    return out


def exposes_requests(sums: WindowSums) -> bool:
    """Whether a group's window holds any request-level family a router exposes."""
    return any(m.name in sums.histograms or m.name in sums.rates for m in catalog.ENTRYPOINT_FAMILIES)


def user_facing(instances: WindowSums, sources: Sequence[WindowSums], generation: WindowSums,
                prompt: WindowSums) -> WindowSums:
    """A topology as its users see it: each request-level family (latencies, finished requests and
    the other outcome families of slo.OUTCOME_FAMILIES) from the first of `sources` that has it (its
    entrypoint, then its decode role), generated tokens from `generation` (decode), prompt tokens
    from `prompt` (prefill), and everything else (KV cache, queues, KV transfer) from its
    instances. No request is counted on two roles."""

    def first(family: str) -> WindowSums:
        return next((s for s in sources if family in s.histograms or family in s.rates), sources[-1])

    finished = first(catalog.REQUEST_SUCCESS.name)
    out = WindowSums(targets=instances.targets, histograms=dict(instances.histograms),
                     rates=dict(instances.rates), reason_rates=dict(finished.reason_rates),
                     hist_rates=dict(instances.hist_rates), gauge_mean_sum=instances.gauge_mean_sum,
                     gauge_max=instances.gauge_max, gauge_target_means=instances.gauge_target_means)
    for metric in dict.fromkeys((*catalog.ENTRYPOINT_FAMILIES, *slo.OUTCOME_FAMILIES)):
        out.histograms.pop(metric.name, None)
        out.rates.pop(metric.name, None)
        source = first(metric.name)
        if metric.name in source.histograms:
            out.histograms[metric.name] = source.histograms[metric.name]
        if metric.name in source.rates:
            out.rates[metric.name] = source.rates[metric.name]
        for part in ("_sum", "_count"):
            out.hist_rates.pop(metric.name + part, None)
            if metric.name + part in source.hist_rates:
                out.hist_rates[metric.name + part] = source.hist_rates[metric.name + part]
    for metric, tokens in ((catalog.GENERATION_TOKENS, generation), (catalog.PROMPT_TOKENS, prompt)):
        out.rates.pop(metric.name, None)
        if metric.name in tokens.rates:
            out.rates[metric.name] = tokens.rates[metric.name]
    return out


def _latency(histogram: _Histogram | None) -> Latency | None:
    if histogram is None or not histogram.bounds:
        return None
    prepared = histogram.prepared()
    quantiles = {label: quantile_of(q, prepared) for q, label in _QUANTILE_LABELS}
    count = histogram.count if histogram.has_count else max(histogram.counts)
    mean = histogram.total / count if count > 0 else math.nan
    return Latency(quantiles, mean, count)


def derive(windows: Sequence[SeriesWindow | None], *, gpus: int, slos_seconds: Mapping[str, float],
           window_seconds: float) -> Derived:
    """Derive one group's figures over one window from its targets' windows (None: no window)."""
    return derive_sums(merge(window_sums(w) for w in windows if w is not None), gpus=gpus,
                       slos_seconds=slos_seconds, window_seconds=window_seconds)


def derive_sums(sums: WindowSums, *, gpus: int, slos_seconds: Mapping[str, float],
                window_seconds: float) -> Derived:
    """Derive a group's figures from its merged WindowSums."""
    if sums.targets == 0:
        return Derived(window_seconds=window_seconds, targets=0, gpus=gpus)
    latency: dict[str, Latency] = {}
    for short, metric in SLO_HISTOGRAMS.items():
        summary = _latency(sums.histograms.get(metric.name))
        if summary is not None:
            latency[short] = summary

    outcomes = slo.outcomes(sums.reason_rates, sums.rates.get(catalog.ADMISSION_REJECTIONS.name),
                            sums.rates.get(catalog.HTTP_REQUESTS.name))
    attainment: dict[str, SloAttainment] = {}
    for kind, threshold in slos_seconds.items():
        slo_metric = SLO_HISTOGRAMS.get(kind)
        histogram = sums.histograms.get(slo_metric.name) if slo_metric is not None else None
        if histogram is None or not histogram.bounds:
            continue
        count = histogram.count if histogram.has_count else None
        fraction = fraction_of(threshold, histogram.prepared(), count)
        observed = sums.hist_rates.get(slo_metric.name + "_count", math.nan)  # type: ignore[union-attr]
        attainment[kind] = _attainment(kind, threshold, fraction.value, fraction.exact, observed, outcomes)
    requests = sums.rates.get(catalog.REQUEST_SUCCESS.name)
    generation = sums.rates.get(catalog.GENERATION_TOKENS.name)
    joint = _joint(attainment, slos_seconds, outcomes, requests, generation)
    kv_means = sums.gauge_target_means.get(catalog.KV_CACHE_USAGE.name)
    return Derived(
        window_seconds=window_seconds,
        targets=sums.targets,
        gpus=gpus,
        latency=latency,
        prompt_tokens_per_second=sums.rates.get(catalog.PROMPT_TOKENS.name),
        generation_tokens_per_second=generation,
        requests_per_second=requests,
        requests_per_second_by_reason=dict(sorted(sums.reason_rates.items())),
        failed_requests_per_second=outcomes.failed if requests is not None else {},
        failures_counted=outcomes.counted if requests is not None else None,
        kv_cache_usage_max=sums.gauge_max.get(catalog.KV_CACHE_USAGE.name),
        kv_cache_usage_mean=math.fsum(kv_means) / len(kv_means) if kv_means else None,
        running=sums.gauge_mean_sum.get(catalog.NUM_REQUESTS_RUNNING.name),
        waiting=sums.gauge_mean_sum.get(catalog.NUM_REQUESTS_WAITING.name),
        preemptions_per_second=sums.rates.get(catalog.NUM_PREEMPTIONS.name),
        attainment=attainment,
        kv_transfer=_kv_transfer(sums),
        **joint,
    )


def _joint(attainment: Mapping[str, SloAttainment], slos_seconds: Mapping[str, float], outcomes: slo.Outcomes,
           requests: float | None, generation: float | None) -> dict[str, Any]:
    """The joint bounds and goodput fields of a Derived (one arithmetic for both paths)."""
    kinds = slo.joint_slos(slos_seconds)
    out: dict[str, Any] = {"joint_slos": kinds}
    if not kinds or not all(s in attainment for s in kinds):
        return out
    lower, upper = slo.joint_bounds(attainment[s].ratio for s in kinds)
    out.update(attainment_lower=lower, attainment_upper=upper)
    if requests is not None:
        every = outcomes.total if outcomes.counted else requests
        out.update(goodput_requests_per_second_lower=slo.goodput(every, lower),
                   goodput_requests_per_second_upper=slo.goodput(every, upper))
    if generation is not None:
        out.update(goodput_tokens_per_second_lower=slo.goodput(generation, lower),
                   goodput_tokens_per_second_upper=slo.goodput(generation, upper))
    return out


def _kv_transfer(sums: WindowSums) -> KvTransfer | None:
    """KV transfers from whichever connector's families the group exposes (NIXL, Mooncake or both,
    summed: their time and bytes buckets are the same)."""
    xfer = moved = None
    failures: float | None = None
    transfers: float | None = None
    moved_rate: float | None = None
    for connector in catalog.KV_CONNECTORS.values():
        xfer = _combined(xfer, sums.histograms.get(connector.xfer_time.name))
        moved = _combined(moved, sums.histograms.get(connector.bytes.name))
        failures = _plus(failures, sums.rates.get(connector.failed_transfers.name))
        transfers = _plus(transfers, sums.hist_rates.get(connector.xfer_time.name + "_count"))
        moved_rate = _plus(moved_rate, sums.hist_rates.get(connector.bytes.name + "_sum"))
    if xfer is None and moved is None and failures is None:
        return None
    bandwidth: float | None = None
    if xfer is not None and moved is not None:
        bandwidth = moved.total / xfer.total if xfer.total > 0 else math.nan
    return KvTransfer(
        time=_latency(xfer),
        transfers_per_second=transfers,
        bytes_per_second=moved_rate,
        bytes_per_transfer_second=bandwidth,
        failures_per_second=failures,
    )


def _combined(first: _Histogram | None, second: _Histogram | None) -> _Histogram | None:
    if first is None or second is None:
        return first or second
    out = first.copy()
    out.add(second)
    return out


def _plus(first: float | None, second: float | None) -> float | None:
    if first is None or second is None:
        return second if first is None else first
    return first + second


# --- many targets of one layout at once ------------------------------------------------------------------
_KV_FAMILIES = frozenset(metric.name for connector in catalog.KV_CONNECTORS.values()
                         for metric in (connector.xfer_time, connector.bytes, connector.failed_transfers))


def _column_total(matrix: np.ndarray, columns: list[int]) -> np.ndarray:
    """`_total` of every row: the one column as it is, several summed with math.fsum."""
    if len(columns) == 1:
        return matrix[:, columns[0]]
    return np.array([math.fsum(row) for row in matrix[:, columns].tolist()], dtype=np.float64)


def _sequential_rows(matrix: np.ndarray, rows: Sequence[int]) -> list[float]:
    """The rows of a 2-D array added one after another in the given order, as merge() adds
    targets (numpy's own sums may pair them differently and round differently)."""
    total = matrix[rows[0]].copy()
    for row in rows[1:]:
        total += matrix[row]
    result: list[float] = total.tolist()
    return result


def _sequential(values: np.ndarray, rows: Sequence[int]) -> float:
    """The entries of a 1-D array added one after another in the given order."""
    picked: list[float] = values[list(rows)].tolist()
    return functools.reduce(operator.add, picked)


def _quantile_rows(q: float, bounds: tuple[float, ...], monotonic: np.ndarray) -> np.ndarray:
    """quantile_of for every row of prepared (monotonic) bucket counts, the same arithmetic."""
    rows = monotonic.shape[0]
    observations = monotonic[:, -1]
    rank = q * observations
    last = len(bounds) - 1
    reached = monotonic[:, :last] >= rank[:, None]
    index = np.where(reached.any(axis=1), reached.argmax(axis=1), last)
    every = np.arange(rows)
    bounds_array = np.asarray(bounds, dtype=np.float64)
    previous_count = np.where(index > 0, monotonic[every, np.maximum(index - 1, 0)], 0.0)
    bucket_start = np.where(index > 0, bounds_array[np.maximum(index - 1, 0)], 0.0)
    inner = np.minimum(index, last - 1)
    bucket_end = bounds_array[inner]
    count = monotonic[every, inner] - previous_count
    with np.errstate(divide="ignore", invalid="ignore"):
        value = bucket_start + (bucket_end - bucket_start) * ((rank - previous_count) / count)
    value = np.where(index == last, bounds[-2], value)
    if bounds[0] <= 0:
        value = np.where(index == 0, bounds[0], value)
    return np.where((observations == 0) | np.isnan(observations), math.nan, value)


def _fraction_rows(threshold: float, bounds: tuple[float, ...], monotonic: np.ndarray,
                   total: np.ndarray) -> tuple[np.ndarray, bool, np.ndarray]:
    """fraction_of for every row: (values, exact, rows without observations: NaN and exact)."""
    empty = (total == 0) | np.isnan(total)
    finite = len(bounds) - 1
    index = bisect.bisect_left(bounds, threshold, 0, finite)
    with np.errstate(divide="ignore", invalid="ignore"):
        boundary = slo.boundary_index(threshold, bounds)
        if boundary is not None:
            return monotonic[:, boundary] / total, True, empty
        if index == finite:
            return monotonic[:, finite - 1] / total, False, empty
        if index == 0 and bounds[0] <= 0:
            return np.zeros(len(total)), False, empty
        if index > 0:
            lower_bound, lower_count = bounds[index - 1], monotonic[:, index - 1]
        else:
            lower_bound, lower_count = 0.0, np.zeros(len(total))
        share = (threshold - lower_bound) / (bounds[index] - lower_bound)
        interpolated = lower_count + (monotonic[:, index] - lower_count) * max(0.0, share)
        return interpolated / total, False, empty


class WindowBatch:
    """The windows of several targets that share one layout (a homogeneous fleet), each reduced
    as `window_sums` reduces one, as arrays with one row per target. Instances are derived from the
    rows at once (`derive_rows`), and groups from rows added in member order (`sums`): the same
    numbers as the per-target path, in the same order of operations."""

    def __init__(self, windows: Sequence[SeriesWindow], layout: _Layout) -> None:
        increase = np.vstack([w.increase_values for w in windows])
        durations = np.array([w.duration for w in windows], dtype=np.float64)
        with np.errstate(divide="ignore"):
            self.per_second = np.where(durations > 0, 1.0 / durations, math.nan)
        self.positive = durations > 0
        self.rows = len(windows)
        self.histograms: dict[str, tuple[tuple[float, ...], np.ndarray, np.ndarray, np.ndarray, bool]] = {}
        self.hist_rates: dict[str, np.ndarray] = {}  # as WindowSums.hist_rates, one row per target
        for family, columns in layout.histograms.items():
            if columns.direct is not None:
                counts = increase[:, columns.direct] if columns.direct else np.zeros((self.rows, 0))
            else:
                counts = np.zeros((self.rows, len(columns.bounds)))
                for slot, column in columns.buckets:
                    counts[:, slot] += increase[:, column]
            zero = np.zeros(self.rows)
            total = _column_total(increase, columns.sums) if columns.sums else zero
            count = _column_total(increase, columns.counts) if columns.counts else zero
            self.histograms[family] = (columns.bounds, counts, total, count, bool(columns.counts))
            if columns.sums:
                self.hist_rates[family + "_sum"] = total * self.per_second
            if columns.counts:
                self.hist_rates[family + "_count"] = count * self.per_second
        self.rates = {family: _column_total(increase, cols) * self.per_second
                      for family, cols in layout.counters.items()}
        self.reason_rates = {reason: _column_total(increase, cols) * self.per_second
                             for reason, cols in layout.reasons.items()}
        self.gauge_mean_sum: dict[str, np.ndarray] = {}
        self.gauge_target_mean: dict[str, np.ndarray] = {}
        self.gauge_max: dict[str, np.ndarray] = {}
        if layout.gauges:
            means = np.vstack([w.mean_values for w in windows])
            highest = np.vstack([w.highest_values for w in windows])
            for family, cols in layout.gauges.items():
                mean_sum = _column_total(means, cols)
                self.gauge_mean_sum[family] = mean_sum
                self.gauge_target_mean[family] = mean_sum / len(cols)
                self.gauge_max[family] = highest[:, cols].max(axis=1)

    @staticmethod
    def usable(windows: Sequence[SeriesWindow], layout: _Layout) -> bool:
        """Complete windows of one layout without KV-transfer families and with finite numbers only (the
        per-target path's NaN and infinity handling is not repeated here)."""
        if any(family in _KV_FAMILIES for family in (*layout.histograms, *layout.counters)):
            return False
        if not all(w.complete for w in windows):
            return False
        for name in ("increase_values", "mean_values", "highest_values"):
            if not np.isfinite(np.vstack([getattr(w, name) for w in windows])).all():
                return False
        return True

    def sums(self, rows: Sequence[int]) -> WindowSums:
        """merge() of the rows' WindowSums, in the order given."""
        out = WindowSums(targets=len(rows))
        for family, (bounds, counts, total, count, has_count) in self.histograms.items():
            out.histograms[family] = _Histogram(bounds, _sequential_rows(counts, rows) if bounds else [],
                                                _sequential(total, rows), _sequential(count, rows), has_count)
        for into, rates in ((out.rates, self.rates), (out.reason_rates, self.reason_rates),
                            (out.gauge_mean_sum, self.gauge_mean_sum)):
            for name, values in rates.items():
                into[name] = _sequential(values, rows)
        timed = [row for row in rows if self.positive[row]]  # window_sums() has no rate without a duration
        if timed:
            for name, values in self.hist_rates.items():
                out.hist_rates[name] = _sequential(values, timed)
        for family, highest in self.gauge_max.items():
            out.gauge_max[family] = max(highest[list(rows)].tolist())
        for family, means in self.gauge_target_mean.items():
            out.gauge_target_means[family] = means[list(rows)].tolist()
        return out

    def derive_rows(self, gpus: Sequence[int], *, slos_seconds: Mapping[str, float],
                    window_seconds: float) -> list[Derived]:
        """derive_sums of each row's own WindowSums (one instance per row)."""
        latency, prepared = self._latency_rows()
        shares = self._slo_share_rows(slos_seconds, prepared)
        columns = self._per_second_rows()
        reasons = sorted(self.reason_rates)
        reason_lists = [self.reason_rates[r].tolist() for r in reasons]
        out: list[Derived] = []
        for row in range(self.rows):
            row_latency = {short: Latency(dict(zip(_LABELS, quantiles[row], strict=True)), means[row],
                                          obs[row])
                           for short, (quantiles, means, obs) in latency.items()}
            row_reasons = {r: values[row] for r, values in zip(reasons, reason_lists, strict=True)}
            at = {name: None if values is None else values[row] for name, values in columns.items()}
            outcomes = slo.outcomes(row_reasons, at["rejections"], at["http"])
            row_attainment = {kind: _attainment(kind, threshold, values[row], exact or empty[row],
                                                observed[row], outcomes)
                              for kind, (threshold, values, exact, empty, observed) in shares.items()}
            counted = at["requests"] is not None
            out.append(Derived(
                window_seconds=window_seconds, targets=1, gpus=gpus[row], latency=row_latency,
                prompt_tokens_per_second=at["prompt"], generation_tokens_per_second=at["generation"],
                requests_per_second=at["requests"], requests_per_second_by_reason=row_reasons,
                failed_requests_per_second=outcomes.failed if counted else {},
                failures_counted=outcomes.counted if counted else None,
                kv_cache_usage_max=at["kv_max"], kv_cache_usage_mean=at["kv_mean"],
                running=at["running"], waiting=at["waiting"], preemptions_per_second=at["preemptions"],
                attainment=row_attainment, kv_transfer=None,
                **_joint(row_attainment, slos_seconds, outcomes, at["requests"], at["generation"]),
            ))
        return out

    def _latency_rows(self) -> tuple[dict[str, tuple[list[list[float]], list[float], list[float]]],
                                     dict[str, np.ndarray | None]]:
        """Per SLO histogram: (quantiles, mean, observations) per row, and its cumulative counts made
        monotonic (None without a +Inf bucket), which the SLO shares reuse."""
        latency: dict[str, tuple[list[list[float]], list[float], list[float]]] = {}
        prepared: dict[str, np.ndarray | None] = {}
        for short, metric in SLO_HISTOGRAMS.items():
            found = self.histograms.get(metric.name)
            if found is None or not found[0]:
                continue
            bounds, counts, total, count, has_count = found
            monotonic = (np.maximum.accumulate(counts, axis=1)
                         if len(bounds) >= 2 and bounds[-1] == math.inf else None)
            prepared[metric.name] = monotonic
            if monotonic is None:
                quantiles = [[math.nan] * self.rows for _ in QUANTILES]
            else:
                quantiles = [_quantile_rows(q, bounds, monotonic).tolist() for q in QUANTILES]
            observations = count if has_count else counts.max(axis=1)
            mean = np.full(self.rows, math.nan)
            np.divide(total, observations, out=mean, where=observations > 0)
            latency[short] = ([list(row) for row in zip(*quantiles, strict=True)], mean.tolist(),
                              observations.tolist())
        return latency, prepared

    def _slo_share_rows(self, slos_seconds: Mapping[str, float], prepared: Mapping[str, np.ndarray | None]
                        ) -> dict[str, tuple[float, list[float], bool, list[bool], list[float]]]:
        """SLO -> (threshold, share within per row, exact, no observations per row, observed/s per row)."""
        shares: dict[str, tuple[float, list[float], bool, list[bool], list[float]]] = {}
        for kind, threshold in slos_seconds.items():
            slo_metric = SLO_HISTOGRAMS.get(kind)
            found = self.histograms.get(slo_metric.name) if slo_metric is not None else None
            if slo_metric is None or found is None or not found[0]:
                continue
            bounds, counts, _total_sum, count, has_count = found
            if slo_metric.name in prepared:
                monotonic = prepared[slo_metric.name]
            elif len(bounds) >= 2 and bounds[-1] == math.inf:
                monotonic = np.maximum.accumulate(counts, axis=1)
            else:
                monotonic = None
            if monotonic is None:
                shares[kind] = (threshold, [math.nan] * self.rows, False, [False] * self.rows,
                                [math.nan] * self.rows)
                continue
            denominator = count if has_count else monotonic[:, -1]
            values, exact, empty = _fraction_rows(threshold, bounds, monotonic, denominator)
            observed = (count * self.per_second if has_count else np.full(self.rows, math.nan)).tolist()
            shares[kind] = (threshold, np.where(empty, math.nan, values).tolist(), exact, empty.tolist(),
                            observed)
        return shares

    def _per_second_rows(self) -> dict[str, list[float] | None]:
        """The rates and gauges a Derived carries, one value per row (None: the family is absent)."""
        kv = catalog.KV_CACHE_USAGE.name
        columns = {
            "generation": self.rates.get(catalog.GENERATION_TOKENS.name),
            "requests": self.rates.get(catalog.REQUEST_SUCCESS.name),
            "prompt": self.rates.get(catalog.PROMPT_TOKENS.name),
            "preemptions": self.rates.get(catalog.NUM_PREEMPTIONS.name),
            "rejections": self.rates.get(catalog.ADMISSION_REJECTIONS.name),
            "http": self.rates.get(catalog.HTTP_REQUESTS.name),
            "kv_max": self.gauge_max.get(kv),
            "kv_mean": self.gauge_target_mean.get(kv),
            "running": self.gauge_mean_sum.get(catalog.NUM_REQUESTS_RUNNING.name),
            "waiting": self.gauge_mean_sum.get(catalog.NUM_REQUESTS_WAITING.name),
        }
        return {name: None if values is None else values.tolist() for name, values in columns.items()}


_LABELS = tuple(label for _, label in _QUANTILE_LABELS)
