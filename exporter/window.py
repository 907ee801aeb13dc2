"""A short per-target history of scrapes and the per-window view that derivation reads.

A window of W seconds ending at `end` holds the scrapes with `end - W <= timestamp <= end` (a closed
range, as Prometheus 2's range selectors). Counter increases follow Prometheus's reset semantics:
over consecutive samples of one series, a drop means the counter restarted, and the new value
counts in full. Unlike PromQL's increase() nothing is extrapolated to the window's edges: the
increase is exactly what happened between the first and the last scrape in the window, and rates
divide by the time between those two scrapes. Quantiles and bucket ratios are unaffected by that
choice (extrapolation would scale numerator and denominator alike).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np

from crossover import catalog
from crossover.exporter.parse import ParsedSeries, SeriesKey


@dataclass(frozen=True)
class Scrape:
    """One successful scrape of one target: the wanted series and their values, in payload order.

    Scrapes of a target whose series did not change share one `keys` tuple, and carry `corrected`:
    each series' running total with counter resets undone (a drop adds the new value, as
    Prometheus's increase does), so an increase over any run of such scrapes is one subtraction."""

    timestamp: float
    keys: tuple[SeriesKey, ...]
    values: np.ndarray  # float64, aligned with keys
    corrected: np.ndarray  # reset-corrected running totals since the keys last changed
    gauges: np.ndarray  # the gauge columns of values (cumulative_mask), taken once for every window

    @staticmethod
    def of(timestamp: float, series: Mapping[SeriesKey, float] | ParsedSeries,
           previous: Scrape | None = None) -> Scrape:
        if isinstance(series, ParsedSeries):
            keys, listed = series
        else:
            keys, listed = tuple(series), list(series.values())
        if previous is not None and (previous.keys is keys or previous.keys == keys):
            values = np.fromiter(listed, dtype=np.float64, count=len(keys))
            steps = values - previous.values
            steps = np.where(steps < 0, values, steps)  # a drop: the counter restarted from zero
            keys = previous.keys
            gauges = values[cumulative_mask(keys)[1]]
            return Scrape(timestamp, keys, values, previous.corrected + steps, gauges)
        if isinstance(series, ParsedSeries):
            keys, listed = series.unique()  # a repeated series: as a dict, the last value wins
        keys = intern_keys(keys)
        values = np.fromiter(listed, dtype=np.float64, count=len(keys))
        return Scrape(timestamp, keys, values, values.copy(), values[cumulative_mask(keys)[1]])


_KEYS: dict[tuple[SeriesKey, ...], tuple[SeriesKey, ...]] = {}


def intern_keys(keys: tuple[SeriesKey, ...]) -> tuple[SeriesKey, ...]:
    """One shared tuple per series layout, across targets: targets of a homogeneous fleet then
    share their per-layout caches (derivation layouts, counter masks) and the tuple's memory.
    Called only when a target's layout changes, and for a window whose series came or went."""
    found = _KEYS.get(keys)
    if found is None:
        if len(_KEYS) > 4096:
            _KEYS.clear()
        _KEYS[keys] = found = keys
    return found


@lru_cache(maxsize=4096)
def is_cumulative(sample_name: str) -> bool:
    """Whether a (current) sample name is a counter or a histogram series: both only grow."""
    found = catalog.CATALOG.family_of_sample(sample_name)
    return found is not None and found[0].type is not catalog.MetricType.GAUGE


@dataclass(frozen=True, eq=False)
class SeriesWindow:
    """What one target's series did over one window, as arrays aligned with `keys`.

    `increase` holds, for counters and histogram series seen in at least two scrapes of the
    window (`counted`), the reset-aware increase (0 elsewhere); `last`, `highest` and `mean` hold
    gauges' statistics over the window's scrapes (`gauge` marks them). Dict views are built on
    demand for readers that want them."""

    start: float  # timestamp of the first scrape in the window
    end: float  # timestamp of the last scrape in the window
    scrapes: int
    keys: tuple[SeriesKey, ...]
    increase_values: np.ndarray
    counted: np.ndarray  # bool
    gauge: np.ndarray  # bool
    last_values: np.ndarray
    highest_values: np.ndarray
    mean_values: np.ndarray
    complete: bool = False  # every scrape had the same series: all counted or gauge, none missing

    @property
    def duration(self) -> float:
        return self.end - self.start

    def _view(self, mask: np.ndarray, values: np.ndarray) -> dict[SeriesKey, float]:
        return {key: value for key, value, keep in zip(self.keys, values.tolist(), mask.tolist(), strict=True)
                if keep}

    @cached_property
    def increase(self) -> dict[SeriesKey, float]:
        return self._view(self.counted, self.increase_values)

    @cached_property
    def gauge_last(self) -> dict[SeriesKey, float]:
        return self._view(self.gauge, self.last_values)

    @cached_property
    def gauge_max(self) -> dict[SeriesKey, float]:
        return self._view(self.gauge, self.highest_values)

    @cached_property
    def gauge_mean(self) -> dict[SeriesKey, float]:
        return self._view(self.gauge, self.mean_values)


def label_values(window: SeriesWindow, label: str) -> list[str]:
    """The values `label` takes on the window's series, sorted."""
    return sorted({value for _, labels in window.keys for name, value in labels if name == label})


def only(window: SeriesWindow, label: str, value: str) -> SeriesWindow:
    """The window's series whose `label` is `value` (a split of the topology's figures, the spec's
    entrypoint.split_by); the others, without the label too, left out."""
    mask = np.fromiter(((label, value) in labels for _, labels in window.keys), dtype=bool,
                       count=len(window.keys))
    keys = intern_keys(tuple(key for key, keep in zip(window.keys, mask.tolist(), strict=True) if keep))
    return SeriesWindow(window.start, window.end, window.scrapes, keys, window.increase_values[mask],
                        window.counted[mask], window.gauge[mask], window.last_values[mask],
                        window.highest_values[mask], window.mean_values[mask], window.complete)


def counter_increase(values: Sequence[float]) -> float:
    """Prometheus's increase without extrapolation: the sum of rises, a drop counting the new value."""
    total = 0.0
    for previous, current in itertools.pairwise(values):
        total += current - previous if current >= previous else current
    return total


_CUMULATIVE_MASKS: dict[int, tuple[tuple[SeriesKey, ...], np.ndarray, np.ndarray]] = {}


def cumulative_mask(keys: tuple[SeriesKey, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(which keys are counters or histogram series, the gauge columns); cached per keys tuple,
    which the scrapes of an unchanged target share."""
    cached = _CUMULATIVE_MASKS.get(id(keys))
    if cached is not None and cached[0] is keys:
        return cached[1], cached[2]
    mask = np.fromiter((is_cumulative(key[0]) for key in keys), dtype=bool, count=len(keys))
    gauges = np.flatnonzero(~mask)
    if len(_CUMULATIVE_MASKS) > 8192:
        _CUMULATIVE_MASKS.clear()
    _CUMULATIVE_MASKS[id(keys)] = (keys, mask, gauges)
    return mask, gauges


def _timestamp(scrape: Scrape) -> float:
    return scrape.timestamp


def window_of(scrapes: Sequence[Scrape], end: float, seconds: float) -> SeriesWindow | None:
    """The window of `seconds` ending at `end`; None with fewer than two scrapes in it."""
    chosen = [s for s in scrapes if end - seconds - 1e-9 <= s.timestamp <= end + 1e-9]
    if len(chosen) < 2:
        return None
    keys = chosen[0].keys
    if all(s.keys is keys for s in chosen):
        return _stacked_window(chosen, keys)
    return _mixed_window(chosen)


def _stacked_window(chosen: Sequence[Scrape], keys: tuple[SeriesKey, ...],
                    gauges: np.ndarray | None = None) -> SeriesWindow:
    """A window whose scrapes all share `keys`; `gauges`, when given, holds the chosen scrapes'
    gauge columns as rows (History keeps them stacked)."""
    cumulative, gauge_columns = cumulative_mask(keys)
    increases = np.where(cumulative, chosen[-1].corrected - chosen[0].corrected, 0.0)
    last = chosen[-1].values
    highest = last.copy()
    mean = last.copy()
    if len(gauge_columns):  # only the few gauges need every scrape of the window
        if gauges is None:
            gauges = np.vstack([s.gauges for s in chosen])
        highest[gauge_columns] = gauges.max(axis=0)
        mean[gauge_columns] = gauges.mean(axis=0)
    return SeriesWindow(chosen[0].timestamp, chosen[-1].timestamp, len(chosen), keys, increases,
                        cumulative, ~cumulative, last, highest, mean, complete=True)


def _mixed_window(chosen: Sequence[Scrape]) -> SeriesWindow:
    """Series came or went inside the window: each series uses the scrapes it appears in."""
    history: dict[SeriesKey, list[float]] = {}
    for scrape in chosen:
        for key, value in zip(scrape.keys, scrape.values.tolist(), strict=True):
            history.setdefault(key, []).append(value)
    keys = intern_keys(tuple(history))
    size = len(keys)
    increases, last, highest, mean = (np.zeros(size) for _ in range(4))
    counted = np.zeros(size, dtype=bool)
    gauge = np.zeros(size, dtype=bool)
    for index, (key, values) in enumerate(history.items()):
        if is_cumulative(key[0]):
            if len(values) >= 2:
                counted[index] = True
                increases[index] = counter_increase(values)
        else:
            gauge[index] = True
            last[index] = values[-1]
            highest[index] = max(values)
            mean[index] = math.fsum(values) / len(values)
    return SeriesWindow(chosen[0].timestamp, chosen[-1].timestamp, len(chosen), keys, increases, counted,
                        gauge, last, highest, mean)


class History:
    """The recent scrapes of one target, long enough for the longest window."""

    def __init__(self, keep_seconds: float) -> None:
        self.keep_seconds = keep_seconds
        self.scrapes: deque[Scrape] = deque()
        self._unordered = 0  # scrapes kept that were added before an earlier-stamped one (clock step)
        # The gauge columns of scrapes[_same_from:] stacked as rows: those scrapes share one keys
        # tuple, so a window among them reads its gauges as a slice instead of stacking every cycle.
        self._same_from = 0
        self._gauges: np.ndarray | None = None

    def add(self, timestamp: float, series: Mapping[SeriesKey, float] | ParsedSeries) -> Scrape:
        previous = self.scrapes[-1] if self.scrapes else None
        scrape = Scrape.of(timestamp, series, previous)
        if previous is not None and timestamp < previous.timestamp:
            self._unordered = len(self.scrapes)
        row = scrape.gauges[np.newaxis, :]
        if previous is not None and scrape.keys is previous.keys and self._gauges is not None:
            self._gauges = np.concatenate((self._gauges, row))
        else:
            self._same_from = len(self.scrapes)
            self._gauges = row
        self.scrapes.append(scrape)
        self.prune(timestamp)
        return scrape

    def prune(self, now: float) -> None:
        """Forget scrapes no window ending now can hold."""
        while self.scrapes and self.scrapes[0].timestamp < now - self.keep_seconds - 1e-6:
            self.scrapes.popleft()
            self._unordered = max(0, self._unordered - 1)
            if self._same_from:
                self._same_from -= 1
            elif self._gauges is not None:
                self._gauges = self._gauges[1:]

    def window(self, end: float, seconds: float) -> SeriesWindow | None:
        scrapes = self.scrapes
        if self._unordered or self._gauges is None:
            return window_of(scrapes, end, seconds)
        low = bisect.bisect_left(scrapes, end - seconds - 1e-9, key=_timestamp)
        high = bisect.bisect_right(scrapes, end + 1e-9, low, key=_timestamp)
        if high - low < 2:
            return None
        chosen = list(itertools.islice(scrapes, low, high))
        if low < self._same_from:
            return window_of(chosen, end, seconds)
        start = low - self._same_from
        return _stacked_window(chosen, chosen[0].keys, self._gauges[start:start + high - low])
