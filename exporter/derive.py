"""Per-window derivations for a group of targets (one instance, one P/D role, or a whole topology).

Pure functions on plain data: `derive(windows, ...)` takes each target's `SeriesWindow` and returns
a `Derived`. Groups are summed the way PromQL's `sum by (le) (increase(...))` sums them: counters
and buckets first, then quantiles and ratios from the sums (never averaged ratios).

One arithmetic, on arrays with a row per target or group (WindowSums): `window_rows` reduces the
windows of targets that share a series layout at once (`window_sums` is one window of it),
`merge_rows` adds groups up from those rows, and `derive_rows` derives every row at once
(`derive_sums` is one row of it; `derive_many` stacks the groups of one shape first). numpy's cost
is per call, so the exporter asks for many rows per call.

Conventions: a family that no target of the group exposes gives None (an absent series, never a
zero); a family that is exposed but saw no observations in the window gives NaN for quantiles,
means and ratios (what Prometheus answers) and 0 for rates.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

import numpy as np

from crossover import catalog, slo
from crossover.exporter.parse import SeriesKey
from crossover.exporter.window import SeriesWindow
from crossover.slo import QUANTILES, SLO_HISTOGRAMS, quantile_label

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
    # Mean preemptions per request its instances finished (catalog.REQUEST_NUM_PREEMPTIONS; None where
    # no target serves it, NaN with no request finished). A P/D request finishes on its prefill and
    # its decode instance: at topology level each counts, so this is per instance-request.
    preemptions_per_request: float | None = None
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


# --- window sums: rows of columns -----------------------------------------------------------------------
@dataclass(frozen=True)
class _Histogram:
    """One histogram family's summed increases, one entry per row: `counts[row, i]` observations at
    or below `bounds[i]` (sorted, distinct); `total` and `count` the increases of `_sum` and `_count`
    (zero without the series: `has_count`)."""

    bounds: tuple[float, ...]
    counts: np.ndarray  # (rows, len(bounds))
    total: np.ndarray  # (rows,)
    count: np.ndarray  # (rows,)
    has_count: bool


# Columns of `added` besides the histograms', by kind: counter families (per second), finished_reason
# (per second), a histogram's family + "_sum"/"_count" (per second), and per gauge family its window
# means summed over targets, its per-target means (engines averaged) summed, and the targets exposing it.
_Column = tuple[str, str]  # (kind, name)
_KINDS = ("rate", "reason", "hist_rate", "gauge_mean_sum", "gauge_target_mean_sum", "gauge_targets")
_ShapeKey = tuple[tuple[tuple[str, tuple[float, ...], bool], ...], tuple[_Column, ...], tuple[str, ...]]


@dataclass(frozen=True, eq=False)
class _Shape:
    """Which families a WindowSums holds, in which columns: `added` (merged by adding; column 0
    counts the targets, then each histogram's counts, total and count, then the other columns in
    key order) and `highest` (each gauge's maximum, merged by taking the max). One object per key
    (`_shape_of`), so WindowSums of one shape stack and merge as they are."""

    key: _ShapeKey
    histograms: dict[str, tuple[tuple[float, ...], int, bool]]  # family -> (bounds, first column, has_count)
    columns: dict[_Column, int]
    maxima: dict[str, int]  # gauge family -> column of `highest`
    width: int


_SHAPES: dict[_ShapeKey, _Shape] = {}


def _shape_of(histograms: Iterable[tuple[str, tuple[float, ...], bool]], columns: Iterable[_Column],
              maxima: Iterable[str]) -> _Shape:
    key = (tuple(sorted(histograms)), tuple(sorted(columns)), tuple(sorted(maxima)))
    found = _SHAPES.get(key)
    if found is None:
        if len(_SHAPES) > 4096:  # the caches keyed by shapes' identities go with them
            _SHAPES.clear()
            _PLANS.clear()
            _MAPS.clear()
            _FACING.clear()
        width = 1
        by_family: dict[str, tuple[tuple[float, ...], int, bool]] = {}
        for family, bounds, has_count in key[0]:
            by_family[family] = (bounds, width, has_count)
            width += len(bounds) + 2
        named = {column: width + i for i, column in enumerate(key[1])}
        found = _SHAPES[key] = _Shape(key, by_family, named, {f: i for i, f in enumerate(key[2])},
                                      width + len(named))
    return found


_EMPTY = _shape_of((), (), ())


def _no_targets() -> np.ndarray:
    return np.zeros((1, 1))


def _no_maxima() -> np.ndarray:
    return np.zeros((1, 0))


@dataclass(frozen=True, eq=False)
class WindowSums:
    """Windows reduced to what derivation needs, one row per target (`window_rows`) or per group of
    targets (`merge`): summed histogram increases, per-second rates (each target's increase over
    its own window length) and gauge statistics, in the columns `shape` names. Every row exposes
    the same families. Reduce each target once, then merge for every group it belongs to.
    `WindowSums()` is one group without targets."""

    shape: _Shape = _EMPTY
    added: np.ndarray = field(default_factory=_no_targets)  # (rows, shape.width)
    highest: np.ndarray = field(default_factory=_no_maxima)  # (rows, len(shape.maxima))

    @property
    def rows(self) -> int:
        return len(self.added)

    @property
    def targets(self) -> np.ndarray:
        """Targets with a window, per row."""
        return self.added[:, 0]

    @cached_property
    def histograms(self) -> dict[str, _Histogram]:
        out = {}
        for family, (bounds, first, has_count) in self.shape.histograms.items():
            end = first + len(bounds)
            out[family] = _Histogram(bounds, self.added[:, first:end], self.added[:, end],
                                     self.added[:, end + 1], has_count)
        return out

    def _named(self, kind: str) -> dict[str, np.ndarray]:
        return {name: self.added[:, column] for (k, name), column in self.shape.columns.items() if k == kind}

    @cached_property
    def rates(self) -> dict[str, np.ndarray]:
        """Counter family -> per second."""
        return self._named("rate")

    @cached_property
    def reason_rates(self) -> dict[str, np.ndarray]:
        """finished_reason -> per second."""
        return self._named("reason")

    @cached_property
    def hist_rates(self) -> dict[str, np.ndarray]:
        """Histogram family + "_sum"/"_count" -> per second."""
        return self._named("hist_rate")

    @cached_property
    def gauge_mean_sum(self) -> dict[str, np.ndarray]:
        """Gauge family -> its window means summed over targets."""
        return self._named("gauge_mean_sum")

    @cached_property
    def gauge_max(self) -> dict[str, np.ndarray]:
        return {family: self.highest[:, column] for family, column in self.shape.maxima.items()}

    @cached_property
    def gauge_target_mean(self) -> dict[str, np.ndarray]:
        """Gauge family -> the mean over targets of each target's window mean (engines averaged)."""
        means, targets = self._named("gauge_target_mean_sum"), self._named("gauge_targets")
        return {family: means[family] / targets[family] for family in means}


@dataclass(frozen=True)
class _HistogramColumns:
    bounds: tuple[float, ...]  # distinct `le` values, sorted
    buckets: list[tuple[int, int]]  # (slot in bounds, column) of each bucket series
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
        histograms[family] = _HistogramColumns(bounds, [(slot[le], column) for column, le in pairs],
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


@dataclass(frozen=True, eq=False)
class _Plan:
    """How window_rows fills the columns of one shape from windows of one layout: increases copied
    (one series) or added (several: engines, label sets, buckets of one bound), counters scaled to
    per second, each histogram's _sum and _count also per second, gauges from the windows' means
    and maxima."""

    shape: _Shape
    copied: tuple[np.ndarray, np.ndarray]  # (columns of added, of the increases)
    added: list[tuple[int, np.ndarray]]  # column of added, the increases added into it
    per_second: np.ndarray  # columns of added multiplied by the rows' 1/duration
    hist_rates: tuple[np.ndarray, np.ndarray]  # (columns of added, the columns they are per second of)
    means: list[tuple[int, np.ndarray]]  # column of added, the gauge means added into it
    target_means: tuple[np.ndarray, np.ndarray, np.ndarray]  # (columns, mean-sum columns, engines)
    gauge_targets: np.ndarray
    maxima: list[tuple[int, np.ndarray]]  # column of highest, the gauge maxima it is the max of


def _plan(layout: _Layout, counted: list[bool] | None, gauge: list[bool] | None) -> _Plan:
    """The plan for windows where `counted` series were seen twice and `gauge` series in every
    scrape (None: all, a complete window)."""
    histograms = {}
    hist_rates: list[_Column] = []
    for family, columns in layout.histograms.items():
        if counted is not None and not (any(counted[c] for _, c in columns.buckets)
                                        or any(counted[c] for c in columns.counts)):
            continue  # the series exist but none was seen twice in the window
        histograms[family] = columns
        hist_rates += [("hist_rate", family + part) for part, cols in (("_sum", columns.sums),
                                                                       ("_count", columns.counts)) if cols]
    counters: dict[_Column, list[int]] = {}  # per second
    for kind, by_name in (("rate", layout.counters), ("reason", layout.reasons)):
        for name, cols in by_name.items():
            if counted is None or any(counted[c] for c in cols):
                counters[(kind, name)] = cols
    gauges = {family: cols for family, cols in layout.gauges.items()
              if gauge is None or all(gauge[c] for c in cols)}
    named = [*hist_rates, *counters, *((kind, family) for family in gauges for kind in _KINDS[3:])]
    shape = _shape_of(((f, c.bounds, bool(c.counts)) for f, c in histograms.items()), named, gauges)
    copied: list[tuple[int, int]] = []
    added: list[tuple[int, np.ndarray]] = []

    def fill(column: int, cols: list[int]) -> None:
        if len(cols) == 1:
            copied.append((column, cols[0]))
        elif cols:
            added.append((column, np.array(cols, dtype=np.intp)))

    per_second: list[tuple[int, int]] = []  # hist_rate columns and the total or count they are of
    for family, columns in histograms.items():
        _, first, _ = shape.histograms[family]
        slots: list[list[int]] = [[] for _ in columns.bounds]
        for slot, column in columns.buckets:
            slots[slot].append(column)
        for slot, cols in enumerate(slots):
            fill(first + slot, cols)
        total, count = first + len(columns.bounds), first + len(columns.bounds) + 1
        fill(total, columns.sums)
        fill(count, columns.counts)
        for part, column, cols in (("_sum", total, columns.sums), ("_count", count, columns.counts)):
            if cols:
                per_second.append((shape.columns[("hist_rate", family + part)], column))
    for column_key, cols in counters.items():
        fill(shape.columns[column_key], cols)
    return _Plan(
        shape, _pairs(copied), added, np.array([shape.columns[c] for c in counters], dtype=np.intp),
        _pairs(per_second),
        [(shape.columns[("gauge_mean_sum", family)], np.array(cols, dtype=np.intp))
         for family, cols in gauges.items()],
        (np.array([shape.columns[("gauge_target_mean_sum", f)] for f in gauges], dtype=np.intp),
         np.array([shape.columns[("gauge_mean_sum", f)] for f in gauges], dtype=np.intp),
         np.array([len(cols) for cols in gauges.values()], dtype=np.float64)),
        np.array([shape.columns[("gauge_targets", f)] for f in gauges], dtype=np.intp),
        [(shape.maxima[family], np.array(cols, dtype=np.intp)) for family, cols in gauges.items()])


def _pairs(pairs: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([a for a, _ in pairs], dtype=np.intp), np.array([b for _, b in pairs], dtype=np.intp))


_PLANS: dict[tuple[int, bytes, bytes], tuple[_Layout, _Plan]] = {}


def _plan_of(layout: _Layout, partial: SeriesWindow | None) -> _Plan:
    """The plan of complete windows of a layout (partial None), or of a window whose series came
    or went; made once per layout and series seen."""
    key = (id(layout), b"", b"") if partial is None else (id(layout), partial.counted.tobytes(),
                                                           partial.gauge.tobytes())
    cached = _PLANS.get(key)
    if cached is not None and cached[0] is layout:
        return cached[1]
    if partial is None:
        plan = _plan(layout, None, None)
    else:
        plan = _plan(layout, partial.counted.tolist(), partial.gauge.tolist())
    if len(_PLANS) > 8192:
        _PLANS.clear()
    _PLANS[key] = (layout, plan)
    return plan


def window_rows(windows: Sequence[SeriesWindow]) -> WindowSums:
    """Reduce windows of one keys tuple, one row each (all of a target's engines and label sets
    summed). Several windows reduce together only when each is complete; a window whose series came
    or went reduces alone, with the families it saw in two scrapes (counters, histograms) or in every
    scrape (gauges)."""
    first = windows[0]
    layout = _layout(first.keys)
    rows = len(windows)
    if rows == 1:
        increase = first.increase_values[np.newaxis, :]
    elif all(w.complete and w.keys is first.keys for w in windows):
        increase = np.vstack([w.increase_values for w in windows])
    else:
        raise ValueError("windows reduce together only when complete and of one keys tuple")
    plan = _plan_of(layout, None if first.complete else first)
    durations = np.array([w.duration for w in windows], dtype=np.float64)
    with np.errstate(divide="ignore"):
        per_second = np.where(durations > 0, 1.0 / durations, math.nan)[:, np.newaxis]
    added = np.zeros((rows, plan.shape.width))
    added[:, 0] = 1.0
    added[:, plan.copied[0]] = increase[:, plan.copied[1]]
    for column, cols in plan.added:
        added[:, column] = increase[:, cols].sum(axis=1)
    added[:, plan.per_second] *= per_second
    added[:, plan.hist_rates[0]] = added[:, plan.hist_rates[1]] * per_second
    highest = np.zeros((rows, len(plan.shape.maxima)))
    if plan.maxima:
        if rows == 1:
            means, maxima = first.mean_values[np.newaxis, :], first.highest_values[np.newaxis, :]
        else:
            means = np.vstack([w.mean_values for w in windows])
            maxima = np.vstack([w.highest_values for w in windows])
        for column, cols in plan.means:
            added[:, column] = means[:, cols].sum(axis=1)
        columns, mean_sums, engines = plan.target_means
        added[:, columns] = added[:, mean_sums] / engines
        added[:, plan.gauge_targets] = 1.0
        for column, cols in plan.maxima:
            highest[:, column] = maxima[:, cols].max(axis=1)
    return WindowSums(plan.shape, added, highest)


def window_sums(window: SeriesWindow) -> WindowSums:
    """One target's window reduced: `window_rows` of one window."""
    return window_rows([window])


# --- groups: rows merged --------------------------------------------------------------------------------
def merge(parts: Iterable[WindowSums]) -> WindowSums:
    """Every row of the parts merged into one (a group of targets' WindowSums); see merge_rows."""
    return merge_rows([(part, None) for part in parts])


def merge_rows(picks: Sequence[tuple[WindowSums, Sequence[int] | None]]) -> WindowSums:
    """One row from the picked rows of each part (None: all its rows), taken in order and added up
    row after row (maxima take the max); a family counts where any row exposes it, and a histogram's
    bounds are the union of the rows' (a bound a layout lacks counts nothing there, as in PromQL's
    sum by (le)). The same rows in the same order give the same floats however they are split into
    parts. A single row is returned as it is (WindowSums are not changed once built); no rows give
    WindowSums()."""
    if not picks:
        return WindowSums()
    if len(picks) == 1 and picks[0][0].rows == 1 and (picks[0][1] is None or list(picks[0][1]) == [0]):
        return picks[0][0]
    shape = picks[0][0].shape
    if any(part.shape is not shape for part, _ in picks):
        shape = _union([part.shape for part, _ in picks])
    added: list[np.ndarray] = []
    highest: list[np.ndarray] = []
    for part, rows in picks:
        values = part.added if rows is None else part.added[rows]
        maxima = part.highest if rows is None else part.highest[rows]
        if part.shape is not shape:
            values, maxima = _mapped(part.shape, shape, values, maxima)
        added.append(values)
        highest.append(maxima)
    return WindowSums(shape, np.concatenate(added).sum(axis=0, keepdims=True),
                      np.concatenate(highest).max(axis=0, keepdims=True))


def _union(shapes: Sequence[_Shape]) -> _Shape:
    bounds: dict[str, list[tuple[float, ...]]] = {}
    counted: dict[str, bool] = {}
    for shape in shapes:
        for family, (family_bounds, _, has_count) in shape.histograms.items():
            bounds.setdefault(family, []).append(family_bounds)
            counted[family] = counted.get(family, False) or has_count
    return _shape_of(((f, _union_bounds(b), counted[f]) for f, b in bounds.items()),
                     {c for shape in shapes for c in shape.columns},
                     {f for shape in shapes for f in shape.maxima})


def _union_bounds(layouts: Iterable[tuple[float, ...]]) -> tuple[float, ...]:
    """A histogram's bounds over targets of several layouts (e.g. one started with
    --custom-histogram-buckets): every bound of any, a bound a layout lacks counting nothing there
    for its targets, as in PromQL's sum by (le)."""
    return tuple(sorted(set().union(*layouts)))


_MAPS: dict[tuple[int, int], tuple[_Shape, _Shape, np.ndarray, np.ndarray]] = {}


def _mapped(part: _Shape, whole: _Shape, added: np.ndarray,
            highest: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of shape `part` in the columns of `whole`, which holds all of part's (added zeros
    elsewhere; maxima -inf, which no max keeps)."""
    cached = _MAPS.get((id(part), id(whole)))
    if cached is None or cached[0] is not part or cached[1] is not whole:
        columns = [0]
        for family, (bounds, _, _) in part.histograms.items():
            whole_bounds, whole_first, _ = whole.histograms[family]
            slot = {bound: i for i, bound in enumerate(whole_bounds)}
            end = whole_first + len(whole_bounds)
            columns += [whole_first + slot[b] for b in bounds] + [end, end + 1]
        columns += [whole.columns[c] for c in part.columns]
        if len(_MAPS) > 4096:
            _MAPS.clear()
        cached = _MAPS[(id(part), id(whole))] = (
            part, whole, np.array(columns, dtype=np.intp),
            np.array([whole.maxima[f] for f in part.maxima], dtype=np.intp))
    values = np.zeros((len(added), whole.width))
    values[:, cached[2]] = added
    maxima = np.full((len(added), len(whole.maxima)), -math.inf)
    maxima[:, cached[3]] = highest
    return values, maxima


def exposes_requests(sums: WindowSums) -> bool:
    """Whether a group's window holds any request-level family a router exposes."""
    return any(m.name in sums.shape.histograms or ("rate", m.name) in sums.shape.columns
               for m in catalog.ENTRYPOINT_FAMILIES)


_Picks = list[tuple[int, np.ndarray, np.ndarray]]  # (part, columns it fills, its columns taken)
_FACING: dict[tuple[int, ...], tuple[tuple[_Shape, ...], _Shape, _Picks]] = {}


def user_facing(instances: WindowSums, sources: Sequence[WindowSums], generation: WindowSums,
                prompt: WindowSums) -> WindowSums:
    """A topology as its users see it: each request-level family (latencies, finished requests and
    the other outcome families of slo.OUTCOME_FAMILIES) from the first of `sources` that has it (its
    entrypoint, then its decode role), generated tokens from `generation` (decode), prompt tokens
    from `prompt` (prefill), and everything else (KV cache, queues, KV transfer) from its
    instances. No request is counted on two roles. The parts have the same rows (groups)."""
    parts = (instances, *sources, generation, prompt)
    shapes = tuple(part.shape for part in parts)
    key = tuple(map(id, shapes))
    cached = _FACING.get(key)
    if cached is None or any(a is not b for a, b in zip(cached[0], shapes, strict=True)):
        if len(_FACING) > 4096:
            _FACING.clear()
        cached = _FACING[key] = (shapes, *_facing_plan(shapes, len(sources)))
    _, shape, picks = cached
    added = np.zeros((instances.rows, shape.width))
    for index, into, taken in picks:
        added[:, into] = parts[index].added[:, taken]
    return WindowSums(shape, added, instances.highest)  # the instances' gauges, in the same columns


def _facing_plan(shapes: tuple[_Shape, ...], sources: int) -> tuple[_Shape, _Picks]:
    """user_facing's choice, which depends on the parts' shapes only: its shape, and per part the
    columns taken from it and where they go."""
    instances, generation, prompt = 0, sources + 1, sources + 2

    def first(family: str) -> int:
        return next((i for i in range(1, sources + 1) if family in shapes[i].histograms
                     or ("rate", family) in shapes[i].columns), sources)

    histograms = dict.fromkeys(shapes[instances].histograms, instances)
    columns: dict[_Column, int] = {c: instances for c in shapes[instances].columns if c[0] != "reason"}
    finished = first(catalog.REQUEST_SUCCESS.name)
    columns.update((c, finished) for c in shapes[finished].columns if c[0] == "reason")
    for metric in dict.fromkeys((*catalog.ENTRYPOINT_FAMILIES, *slo.OUTCOME_FAMILIES)):
        source = first(metric.name)
        histograms.pop(metric.name, None)
        if metric.name in shapes[source].histograms:
            histograms[metric.name] = source
        for column in (("rate", metric.name), ("hist_rate", metric.name + "_sum"),
                       ("hist_rate", metric.name + "_count")):
            columns.pop(column, None)
            if column in shapes[source].columns:
                columns[column] = source
    for metric, source in ((catalog.GENERATION_TOKENS, generation), (catalog.PROMPT_TOKENS, prompt)):
        columns.pop(("rate", metric.name), None)
        if ("rate", metric.name) in shapes[source].columns:
            columns[("rate", metric.name)] = source
    shape = _shape_of(((family, shapes[i].histograms[family][0], shapes[i].histograms[family][2])
                       for family, i in histograms.items()), columns, shapes[instances].maxima)
    taken: dict[int, list[tuple[int, int]]] = {instances: [(0, 0)]}  # the instances' targets
    for family, index in histograms.items():
        bounds, into, _ = shape.histograms[family]
        start = shapes[index].histograms[family][1]
        taken.setdefault(index, []).extend((into + i, start + i) for i in range(len(bounds) + 2))
    for column, index in columns.items():
        taken.setdefault(index, []).append((shape.columns[column], shapes[index].columns[column]))
    return shape, [(index, *_pairs(pairs)) for index, pairs in taken.items()]


# --- derivation: every row at once ----------------------------------------------------------------------
def derive(windows: Sequence[SeriesWindow | None], *, gpus: int, slos_seconds: Mapping[str, float],
           window_seconds: float) -> Derived:
    """Derive one group's figures over one window from its targets' windows (None: no window)."""
    return derive_sums(merge(window_sums(w) for w in windows if w is not None), gpus=gpus,
                       slos_seconds=slos_seconds, window_seconds=window_seconds)


def derive_sums(sums: WindowSums, *, gpus: int, slos_seconds: Mapping[str, float],
                window_seconds: float) -> Derived:
    """Derive a group's figures from its merged WindowSums (one row)."""
    (derived,) = derive_rows(sums, [gpus], slos_seconds=slos_seconds, window_seconds=window_seconds)
    return derived


def derive_many(parts: Sequence[tuple[WindowSums, Sequence[int]]], *, slos_seconds: Mapping[str, float],
                window_seconds: float) -> list[list[Derived]]:
    """derive_rows of each (sums, GPUs per row), the parts of one shape (families and bounds)
    stacked and derived in one call: numpy's cost is per call, so a hundred one-row groups cost
    about what one does. The figures of a row do not depend on the rows beside it."""
    by_shape: dict[_Shape, list[int]] = {}
    for index, (part, _) in enumerate(parts):
        by_shape.setdefault(part.shape, []).append(index)
    out: list[list[Derived]] = [[] for _ in parts]
    for indices in by_shape.values():
        chosen = [parts[i][0] for i in indices]
        derived = derive_rows(chosen[0] if len(chosen) == 1 else _stacked(chosen),
                              [g for i in indices for g in parts[i][1]],
                              slos_seconds=slos_seconds, window_seconds=window_seconds)
        start = 0
        for index, part in zip(indices, chosen, strict=True):
            out[index] = derived[start:start + part.rows]
            start += part.rows
    return out


def _stacked(parts: Sequence[WindowSums]) -> WindowSums:
    """The rows of parts of one shape, in one WindowSums."""
    return WindowSums(parts[0].shape, np.concatenate([p.added for p in parts]),
                      np.concatenate([p.highest for p in parts]))


def derive_rows(sums: WindowSums, gpus: Sequence[int], *, slos_seconds: Mapping[str, float],
                window_seconds: float) -> list[Derived]:
    """Each row's figures (one target, or one merged group): histogram_quantile, SLO shares, means,
    rates and gauges computed for every row at once, then the SLO module's outcomes, attainment and
    joint bounds per row."""
    rows = sums.rows
    monotonic = {name: _monotonic(h) for name, h in sums.histograms.items() if name in _SLO_FAMILIES}
    latency = {short: _latency_rows(histogram, monotonic[metric.name])
               for short, metric in SLO_HISTOGRAMS.items()
               if (histogram := sums.histograms.get(metric.name)) is not None and histogram.bounds}
    shares = _slo_share_rows(sums, slos_seconds, monotonic)
    kv_transfer = _kv_transfer_rows(sums)
    columns = _per_second_rows(sums)
    preempted = sums.histograms.get(catalog.REQUEST_NUM_PREEMPTIONS.name)
    per_request = None if preempted is None else [latency.mean for latency in _latency_rows(preempted, None)]
    reasons = sorted(sums.reason_rates)
    reason_lists = [sums.reason_rates[r].tolist() for r in reasons]
    targets = [int(count) for count in sums.targets.tolist()]
    out: list[Derived] = []
    for row in range(rows):
        if not targets[row]:
            out.append(Derived(window_seconds=window_seconds, targets=0, gpus=gpus[row]))
            continue
        row_reasons = {r: values[row] for r, values in zip(reasons, reason_lists, strict=True)}
        at = {name: None if values is None else values[row] for name, values in columns.items()}
        outcomes = slo.outcomes(row_reasons, at["rejections"], at["http"])
        row_attainment = {kind: _attainment(kind, threshold, values[row], exact[row], observed[row], outcomes)
                          for kind, (threshold, values, exact, observed) in shares.items()}
        counted = at["requests"] is not None
        requests = at["requests"]
        if slo.ROUTED_REASON in row_reasons:
            # A router's routed requests hold its failed ones: shown as vLLM's finished requests by
            # reason (served as "stop"), as the recording rules show them.
            row_reasons = {"stop": outcomes.served, **{r: v for r, v in row_reasons.items()
                                                       if r in slo.FAILED_REASONS}}
            requests = outcomes.served + outcomes.failed_finished
        out.append(Derived(
            window_seconds=window_seconds, targets=targets[row], gpus=gpus[row],
            latency={short: latencies[row] for short, latencies in latency.items()},
            prompt_tokens_per_second=at["prompt"], generation_tokens_per_second=at["generation"],
            requests_per_second=requests, requests_per_second_by_reason=row_reasons,
            failed_requests_per_second=outcomes.failed if counted else {},
            failures_counted=outcomes.counted if counted else None,
            kv_cache_usage_max=at["kv_max"], kv_cache_usage_mean=at["kv_mean"],
            running=at["running"], waiting=at["waiting"], preemptions_per_second=at["preemptions"],
            preemptions_per_request=None if per_request is None else per_request[row],
            attainment=row_attainment, kv_transfer=None if kv_transfer is None else kv_transfer[row],
            **_joint(row_attainment, slos_seconds, outcomes, requests, at["generation"]),
        ))
    return out


_SLO_FAMILIES = frozenset(metric.name for metric in SLO_HISTOGRAMS.values())
_QUANTILES = np.array(QUANTILES, dtype=np.float64)
_LABELS = tuple(label for _, label in _QUANTILE_LABELS)


def _monotonic(histogram: _Histogram) -> np.ndarray | None:
    """Each row's counts as promql's ensureMonotonic leaves them (a running maximum; a NaN count
    stays NaN and is skipped); None where histogram_quantile answers NaN whatever the counts: no
    +Inf bucket, or fewer than two buckets."""
    bounds = histogram.bounds
    if len(bounds) < 2 or bounds[-1] != math.inf:
        return None
    counts = histogram.counts
    return np.where(np.isnan(counts), counts, np.fmax.accumulate(counts, axis=1))


def _latency_rows(histogram: _Histogram, monotonic: np.ndarray | None) -> list[Latency]:
    """Quantiles (QUANTILES), mean (sum/count) and observations of every row."""
    rows = len(histogram.counts)
    if monotonic is None:
        quantiles: list[list[float]] = [[math.nan] * len(QUANTILES)] * rows
    else:
        quantiles = _quantile_rows(histogram.bounds, monotonic).tolist()
    observations = histogram.count if histogram.has_count else histogram.counts.max(axis=1)
    mean = np.full(rows, math.nan)
    np.divide(histogram.total, observations, out=mean, where=observations > 0)
    return [Latency(dict(zip(_LABELS, values, strict=True)), m, o)
            for values, m, o in zip(quantiles, mean.tolist(), observations.tolist(), strict=True)]


def _quantile_rows(bounds: tuple[float, ...], monotonic: np.ndarray) -> np.ndarray:
    """histogram_quantile (quantile.quantile_of) of each of QUANTILES for every row of prepared
    (monotonic) counts, the same arithmetic in the same order: (rows, len(QUANTILES)). The bucket
    holding the rank is the first to reach it (+Inf excluded); with a NaN count, which no vLLM
    exposes, a binary search's answer would depend on where it probes."""
    observations = monotonic[:, -1:]
    rank = _QUANTILES * observations
    last = len(bounds) - 1
    reached = monotonic[:, np.newaxis, :last] >= rank[:, :, np.newaxis]
    index = np.where(reached.any(axis=2), reached.argmax(axis=2), last)
    every = np.arange(len(monotonic))[:, np.newaxis]
    bounds_array = np.asarray(bounds, dtype=np.float64)
    below = np.maximum(index - 1, 0)
    previous_count = np.where(index > 0, monotonic[every, below], 0.0)
    bucket_start = np.where(index > 0, bounds_array[below], 0.0)
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


def _slo_share_rows(sums: WindowSums, slos_seconds: Mapping[str, float],
                    monotonic: Mapping[str, np.ndarray | None]
                    ) -> dict[str, tuple[float, list[float], list[bool], list[float]]]:
    """SLO -> (threshold, share within, exact, observations per second), each per row."""
    rows = sums.rows
    shares: dict[str, tuple[float, list[float], list[bool], list[float]]] = {}
    for kind, threshold in slos_seconds.items():
        metric = SLO_HISTOGRAMS.get(kind)
        histogram = sums.histograms.get(metric.name) if metric is not None else None
        if metric is None or histogram is None or not histogram.bounds:
            continue
        observed_rate = sums.hist_rates.get(metric.name + "_count")
        observed = [math.nan] * rows if observed_rate is None else observed_rate.tolist()
        prepared = monotonic[metric.name]
        if prepared is None:
            shares[kind] = (threshold, [math.nan] * rows, [False] * rows, observed)
            continue
        denominator = histogram.count if histogram.has_count else prepared[:, -1]
        values, exact, empty = _fraction_rows(threshold, histogram.bounds, prepared, denominator)
        shares[kind] = (threshold, np.where(empty, math.nan, values).tolist(),
                        [exact] * rows if exact else empty.tolist(), observed)
    return shares


def _per_second_rows(sums: WindowSums) -> dict[str, list[float] | None]:
    """The rates and gauges a Derived carries, one value per row (None: the family is absent)."""
    kv = catalog.KV_CACHE_USAGE.name
    columns = {
        "generation": sums.rates.get(catalog.GENERATION_TOKENS.name),
        "requests": sums.rates.get(catalog.REQUEST_SUCCESS.name),
        "prompt": sums.rates.get(catalog.PROMPT_TOKENS.name),
        "preemptions": sums.rates.get(catalog.NUM_PREEMPTIONS.name),
        "rejections": sums.rates.get(catalog.ADMISSION_REJECTIONS.name),
        "http": sums.rates.get(catalog.HTTP_REQUESTS.name),
        "kv_max": sums.gauge_max.get(kv),
        "kv_mean": sums.gauge_target_mean.get(kv),
        "running": sums.gauge_mean_sum.get(catalog.NUM_REQUESTS_RUNNING.name),
        "waiting": sums.gauge_mean_sum.get(catalog.NUM_REQUESTS_WAITING.name),
    }
    return {name: None if values is None else values.tolist() for name, values in columns.items()}


def _joint(attainment: Mapping[str, SloAttainment], slos_seconds: Mapping[str, float], outcomes: slo.Outcomes,
           requests: float | None, generation: float | None) -> dict[str, Any]:
    """The joint bounds and goodput fields of a Derived."""
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


def _kv_transfer_rows(sums: WindowSums) -> list[KvTransfer] | None:
    """KV transfers of every row from whichever connector's families the rows expose (NIXL,
    Mooncake or both, summed: their time and bytes buckets are the same)."""
    xfer = moved = None
    failures: np.ndarray | None = None
    transfers: np.ndarray | None = None
    moved_rate: np.ndarray | None = None
    for connector in catalog.KV_CONNECTORS.values():
        xfer = _combined(xfer, sums.histograms.get(connector.xfer_time.name))
        moved = _combined(moved, sums.histograms.get(connector.bytes.name))
        failures = _plus(failures, sums.rates.get(connector.failed_transfers.name))
        transfers = _plus(transfers, sums.hist_rates.get(connector.xfer_time.name + "_count"))
        moved_rate = _plus(moved_rate, sums.hist_rates.get(connector.bytes.name + "_sum"))
    if xfer is None and moved is None and failures is None:
        return None
    rows = sums.rows
    bandwidth: np.ndarray | None = None
    if xfer is not None and moved is not None:
        bandwidth = np.full(rows, math.nan)
        np.divide(moved.total, xfer.total, out=bandwidth, where=xfer.total > 0)
    times: list[Latency | None] = [None] * rows
    if xfer is not None and xfer.bounds:
        times = list(_latency_rows(xfer, _monotonic(xfer)))
    listed = [[None] * rows if values is None else values.tolist()
              for values in (transfers, moved_rate, bandwidth, failures)]
    return [KvTransfer(time, *row) for time, *row in zip(times, *listed, strict=True)]


def _combined(first: _Histogram | None, second: _Histogram | None) -> _Histogram | None:
    """Two families' histograms added, row by row."""
    if first is None or second is None:
        return first or second
    bounds = first.bounds if first.bounds == second.bounds else _union_bounds((first.bounds, second.bounds))
    a, b = (_in_bounds(first, bounds), _in_bounds(second, bounds))
    return _Histogram(bounds, a + b, first.total + second.total, first.count + second.count,
                      first.has_count or second.has_count)


def _in_bounds(histogram: _Histogram, bounds: tuple[float, ...]) -> np.ndarray:
    """The histogram's counts over `bounds`, which hold all of its own."""
    if histogram.bounds == bounds:
        return histogram.counts
    slot = {bound: i for i, bound in enumerate(bounds)}
    counts = np.zeros((len(histogram.counts), len(bounds)))
    counts[:, np.array([slot[b] for b in histogram.bounds], dtype=np.intp)] = histogram.counts
    return counts


def _plus(first: np.ndarray | None, second: np.ndarray | None) -> np.ndarray | None:
    if first is None or second is None:
        return second if first is None else first
    return first + second
