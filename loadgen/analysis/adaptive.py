"""Adaptive sweeps: measure only the levels that narrow the answer.

Levels cost more the higher they go (a closed-loop level sends rounds x concurrency requests, an
open-loop one rate x duration), so the search starts cheap: with the range given as its two ends,
the coarse start is the low end and the middle on a log axis, and the range above is measured
only while an answer may lie there (a pair of topologies that does not cross below, a topology
that meets the objective at every level so far): at the middle of what is left, then the end,
each climb once the highest level's repeats agree that the answer lies above it (a climb spends
the range's dearest levels on that one level's word; repeats below). Then each next level goes
inside the widest interval that matters: a crossing of the chosen metric between two
topologies, or a topology's capacity at the SLO objective (both with their bootstrap intervals
from loadgen.crossings, each widened to its bracket: the measured levels either side of its
estimate that bound it): interpolation between far levels cannot see a jump of the curves (p99
ITL once prefills stall decodes), and the bootstrap holds each level's noise, not the curve's
shape between levels. A wide bracket gets its estimate measured when that lies in the bracket's
middle half, else its log middle: bisection, which finds a jump wherever it is. The sweep stops
when every such interval and bracket is narrower than `target_ci` (a width relative to its
estimate) and the bracket's two end levels are confirmed, when the request or time budget would
be overspent by the next level, or when no unmeasured level is left inside them. An end is
measured again with fresh seeds (a repeat: other arrival times and prompts): one level holds one
arrival sequence, and a metric that jumps (p99 ITL once a stall enters its 1% tail) reads either
side of the jump near it by chance, which a bootstrap over that one sequence's requests cannot
see. `max_repeats` repeats that all read the end's side confirm it; two that disagree split it:
the level lies in the jump's band and bounds nothing, so the bracket reaches past it to levels
that do (crossings.split_levels), and bisection goes on beside the band.
Levels given beyond the two ends are all measured first, as the user's own coarse start.
Pure functions of the crossover report (loadgen.report: crossover.json) and the levels measured:
no I/O, no traffic. A decision is kept in the report as its AdaptiveState (Decision.state).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from crossover import slo
from crossover.errors import UserError
from crossover.loadgen.analysis.crossings import METRICS, ComparedMetric, bracket, repeat_sides
from crossover.loadgen.analysis.report import (
    STOP_REASONS,
    AdaptiveState,
    Capacity,
    Crossover,
    CrossoverReport,
    ReportedInterval,
    metric_named,
)
from crossover.loadgen.plan import Mode, SweepPlan

DEFAULT_METRIC = slo.GOODPUT_REQUESTS
DEFAULT_TARGET_CI = 0.1
DEFAULT_MAX_REPEATS = 2
ANSWERS = ("crossing", "capacity")  # the kinds of interval an adaptive sweep may narrow

@dataclass(frozen=True)
class AdaptivePlan:
    """How an adaptive sweep chooses levels and when it stops (run.json's "adaptive")."""

    target_ci: float = DEFAULT_TARGET_CI
    metric: str = DEFAULT_METRIC
    max_requests: int | None = None  # requests over every topology and level, resumed ones included
    max_duration_s: float | None = None  # seconds of traffic over every topology and level
    answers: tuple[str, ...] = ANSWERS
    max_repeats: int = DEFAULT_MAX_REPEATS  # agreeing measurements that confirm a bracket end (1: no repeats)

    def __post_init__(self) -> None:
        object.__setattr__(self, "answers", tuple(self.answers))
        object.__setattr__(self, "metric", metric_named(self.metric))  # an old run.json's, or --metric's
        if not self.answers or any(a not in ANSWERS for a in self.answers):
            raise UserError(f"--narrow: want one or both of {','.join(ANSWERS)}, "
                            f"got {','.join(self.answers)}")
        if not (0 < self.target_ci < 1):
            raise UserError(f"--target-ci: must be a relative width between 0 and 1 (e.g. 0.1), "
                            f"got {self.target_ci:g}")
        if self.metric not in METRICS:
            raise UserError(f"--metric: unknown metric {self.metric!r} (use {', '.join(METRICS)})")
        if self.max_requests is not None and self.max_requests < 1:
            raise UserError(f"--max-requests: must be at least 1, got {self.max_requests}")
        repeats = self.max_repeats
        if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
            raise UserError(f"--max-repeats: must be a whole number of at least 1, got {self.max_repeats}")
        if self.max_duration_s is not None and not (0 < self.max_duration_s < math.inf):
            raise UserError(f"--max-duration: must be a positive number of seconds, "
                            f"got {self.max_duration_s:g}")

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "answers": list(self.answers)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdaptivePlan:
        return cls(**{**data, "answers": tuple(data.get("answers", ANSWERS))})


@dataclass(frozen=True)
class Interval:
    """One answer the sweep is narrowing, on the load axis."""

    what: str  # e.g. "goodput_requests_per_second crossing tp4x1/tp2x2" or "capacity tp4x1"
    x: float
    low: float | None
    high: float | None
    # How a level reads which side of the answer it lies on: `column` of `ahead` against `versus`'s
    # (a crossing: the topologies that lead after and before it) or against a number (a capacity:
    # the objective); past the answer when the difference has the sign `past_sign`.
    column: str = ""
    ahead: str = ""
    versus: str | float = ""
    past_sign: int = 1
    between: tuple[float, float] | None = None  # the analysis's bracket (crossings.bracket), if given

    @property
    def width(self) -> float:
        """(high - low) / x; infinite without an interval (too few levels for a bootstrap)."""
        if self.low is None or self.high is None or not self.x > 0:
            return math.inf
        return (self.high - self.low) / self.x

    def ends(self, measured: Sequence[float]) -> tuple[float, float] | None:
        """The measured levels nearest the estimate either side of it that bound it: the analysis's
        bracket (past the levels whose repeats split), else crossings.bracket of the levels measured."""
        return self.between or bracket(measured, self.x)

    def reported(self) -> ReportedInterval:
        """As the report keeps it (AdaptiveState)."""
        width = self.width if math.isfinite(self.width) else None
        return ReportedInterval(self.what, self.x, self.low, self.high, width)


def _log_middle(low: float, high: float, mode: Mode) -> float:
    middle = math.sqrt(low * high)
    return float(round(middle)) if mode is Mode.CLOSED else _round_rate(middle)


def _round_rate(rate: float) -> float:
    return float(f"{rate:.3g}")


def _level_at(u: float, mode: Mode) -> float:
    """The level a sweep can measure nearest a position on the axis (Mode.scale): a whole
    concurrency, a rate of three significant digits."""
    level = mode.unscale(u)
    return float(max(1, round(level))) if mode is Mode.CLOSED else _round_rate(level)


def coarse_levels(plan: SweepPlan) -> tuple[float, ...]:
    """The levels an adaptive sweep starts with: the plan's, or of two ends the low one and the
    log middle (the high end waits until an answer may lie above the middle)."""
    levels = plan.levels
    if len(levels) < 2:
        raise UserError(f"--adaptive: give the range to search as at least two {plan.axis} levels "
                        f"(its ends), got {list(levels)}")
    if len(levels) == 2:
        middle = _log_middle(levels[0], levels[1], plan.mode)
        if levels[0] < middle < levels[1]:
            return (levels[0], middle)
    return levels


def level_above(plan: SweepPlan, measured: Sequence[float]) -> float | None:
    """The next level up when an answer may lie above the highest measured: the log middle of
    what is left of the range, or its end when the middle would be as near as a doubling."""
    top, end = max(measured), plan.levels[-1]
    if top >= end:
        return None
    middle = _log_middle(top, end, plan.mode)
    return middle if top < middle < end and end / top > 4 else end


def open_above(report: CrossoverReport, adaptive: AdaptivePlan) -> list[Interval]:
    """The answers that may lie above the highest level measured: pairs that do not cross in the
    metric there, topologies that meet the objective at every level so far. Each is an Interval
    without bounds that reads a level's side as its crossing or capacity will (past it: the pair's
    follower ahead, the objective missed; a pair with no leader yet reads no side)."""
    metric = METRICS[adaptive.metric]
    found = []
    if "crossing" in adaptive.answers:
        found += [_crossing(c, metric, c.loser, c.winner) for c in report.crossovers
                  if c.metric == metric.name and c.kind in ("none", "insufficient")]
    if "capacity" in adaptive.answers:
        found += [_capacity(c) for c in report.capacities if c.censored == "above"]
    return found


def unconfirmed_top(above: Sequence[Interval], measured: Sequence[float], by_repeat: pd.DataFrame,
                    max_repeats: int) -> int | None:
    """The repeat of the highest measured level to measure before climbing past it, or None. The
    climb spends the range's dearest levels on that level's word that every open answer lies
    above it, so the word is taken as a bracket end's is (unconfirmed_end): measured again while
    its repeats, fewer than max_repeats, all read before each answer. Once two disagree the level
    lies in an answer's band, which may reach above it: the climb bounds it there."""
    top = max(measured)
    repeats = repeats_of(by_repeat, top)
    if repeats >= max_repeats:
        return None
    for answer in above:
        if answer.ahead and all(s == -1 for s in level_sides(answer, by_repeat, top)):
            return repeats + 1
    return None


def check_budget(plan: SweepPlan, adaptive: AdaptivePlan, topologies: int) -> None:
    """A budget that cannot pay for the coarse start is a mistake: say so before any traffic."""
    coarse = coarse_levels(plan)
    costs = [plan.requests_for(level) for level in coarse]
    if adaptive.max_requests is not None and all(c is not None for c in costs):
        needed = sum(c or 0 for c in costs) * topologies
        if needed > adaptive.max_requests:
            raise UserError(f"--max-requests: {adaptive.max_requests} is less than the coarse start "
                            f"needs ({len(coarse)} levels x {topologies} topologies = {needed} requests)")
    if adaptive.max_duration_s is not None:
        seconds = [_planned_seconds(plan, level, c) for level, c in zip(coarse, costs, strict=True)]
        if all(s is not None for s in seconds):
            needed_s = sum(s or 0.0 for s in seconds) * topologies
            if needed_s > adaptive.max_duration_s:
                raise UserError(f"--max-duration: {adaptive.max_duration_s:g} s is less than the coarse "
                                f"start needs ({len(coarse)} levels x {topologies} topologies = "
                                f"{needed_s:g} s)")


def _planned_seconds(plan: SweepPlan, level: float, requests: int | None) -> float | None:
    """A level's length when the plan fixes it: its duration, or open-loop requests / rate."""
    if plan.duration_s is not None and (plan.mode is Mode.CLOSED and requests is None):
        return plan.ramp_s + plan.duration_s
    if plan.mode is Mode.OPEN and requests is not None:
        return plan.ramp_s / 2 + requests / level
    return None


def _spanned(found: Crossover | Capacity) -> tuple[float | None, float | None]:
    """An answer's interval: its bootstrap interval, widened to the measured levels either side of
    its estimate (the bootstrap holds each level's noise under interpolation, not a step of the
    curves between two levels). None without a bootstrap interval (too few levels)."""
    low, high = found.ci_low, found.ci_high
    if low is None or high is None:
        return None, None
    return (min(low, found.bracket_low or low), max(high, found.bracket_high or high))


def _crossing(found: Crossover, metric: ComparedMetric, ahead: str, versus: str,
              x: float = math.nan, low: float | None = None, high: float | None = None) -> Interval:
    """A pair's crossing of `metric`, past it when `ahead` leads `versus`."""
    return Interval(f"{metric.name} crossing {found.topology_a}/{found.topology_b}", x, low, high,
                    metric.column, ahead, versus, 1 if metric.higher_is_better else -1, _between(found))


def _capacity(found: Capacity, x: float = math.nan, low: float | None = None,
              high: float | None = None) -> Interval:
    """A topology's capacity, past it when its attainment falls below the objective."""
    return Interval(f"capacity {found.topology}", x, low, high, slo.attainment_column(),
                    found.topology, float(found.objective), -1, _between(found))


def _between(found: Crossover | Capacity) -> tuple[float, float] | None:
    low, high = found.bracket_low, found.bracket_high
    return (float(low), float(high)) if low is not None and high is not None else None


def intervals(report: CrossoverReport, adaptive: AdaptivePlan) -> list[Interval]:
    """The intervals that matter in an analyze() result: every crossing of the metric and every
    capacity found inside the range (a capacity at the range's edge has nothing to narrow), each
    spanning its bootstrap interval and its bracket."""
    metric = METRICS[adaptive.metric]
    found = []
    if "crossing" in adaptive.answers:
        found += [_crossing(c, metric, c.winner, c.loser, float(c.x), *_spanned(c))
                  for c in report.crossovers
                  if c.metric == metric.name and c.kind == "crossing" and c.x is not None]
    if "capacity" in adaptive.answers:
        found += [_capacity(c, float(c.x), *_spanned(c))
                  for c in report.capacities if not c.censored and c.x is not None]
    return found


def level_inside(interval: Interval, measured: Sequence[float], plan: SweepPlan) -> float | None:
    """An unmeasured level inside the interval that tells most about it: the estimate itself,
    unless a measured level sits close by; then the middle of the widest gap between measured
    levels inside the interval. None when every level there is measured (closed loop: integers)."""
    low = interval.low if interval.low is not None else min(measured)
    high = interval.high if interval.high is not None else max(measured)
    low, high = max(low, plan.levels[0]), min(high, plan.levels[-1])
    mode = plan.mode
    u_low, u_high = mode.scale(low), mode.scale(high)
    inside = sorted(mode.scale(m) for m in measured if low < m < high)
    edges = [u_low, *inside, u_high]
    gaps = sorted(((b - a, (a + b) / 2) for a, b in itertools.pairwise(edges)), reverse=True)
    estimate = mode.scale(min(max(interval.x, low), high))
    near = min((abs(estimate - mode.scale(m)) for m in measured), default=math.inf)
    candidates = ([estimate] if gaps and near >= gaps[0][0] / 4 else []) + [middle for _, middle in gaps]
    taken = set(measured)
    for u in candidates:
        level = _level_at(u, mode)
        if low <= level <= high and level not in taken:
            return level
    return None


def bracket_width(interval: Interval, measured: Sequence[float]) -> float:
    """The bracket's width relative to the estimate: how far the estimate may be from where the
    curves really cross when they jump between the two levels (interpolation cannot see a step)."""
    found = interval.ends(measured)
    if found is None or not interval.x > 0:
        return math.inf
    return (found[1] - found[0]) / interval.x


def bracket_level(interval: Interval, measured: Sequence[float], plan: SweepPlan) -> float | None:
    """The next level inside a bracket too wide to trust: the estimate (closed loop: a whole
    concurrency beside it) when it lies in the bracket's middle half on the axis, else the bracket's
    middle. Either way the bracket shrinks by at least a quarter, so a step is found wherever it is,
    however smooth the interpolation looks. Levels inside the bracket are split ones (they bound
    nothing): then the widest gap between them and the ends is the bracket narrowed, as the band
    they mark needs no more levels. None when no level fits between the two."""
    ends = interval.ends(measured)
    if ends is None:
        return None
    edges = [ends[0], *sorted(m for m in measured if ends[0] < m < ends[1]), ends[1]]
    gaps = sorted(itertools.pairwise(edges), reverse=True,
                  key=lambda gap: plan.mode.scale(gap[1]) - plan.mode.scale(gap[0]))
    return next((level for low, high in gaps
                 if (level := _bisecting(interval.x, low, high, measured, plan)) is not None), None)


def _bisecting(x: float, low: float, high: float, measured: Sequence[float], plan: SweepPlan) -> float | None:
    """An unmeasured level between low and high: x (a whole concurrency beside it) when it lies in
    their middle half on the axis, else their log middle."""
    u_low, u_high = plan.mode.scale(low), plan.mode.scale(high)
    quarter = (u_high - u_low) / 4
    near = ((round(x), math.floor(x), math.ceil(x)) if plan.mode is Mode.CLOSED else (_round_rate(x),))
    for level in (*(float(c) for c in near if c >= 1), _log_middle(low, high, plan.mode)):
        inside = u_low + quarter <= plan.mode.scale(level) <= u_high - quarter
        if low < level < high and level not in measured and (inside or not quarter):
            return level
    middle = _log_middle(low, high, plan.mode)
    return middle if low < middle < high and middle not in measured else None


def level_sides(interval: Interval, by_repeat: pd.DataFrame, level: float) -> list[int]:
    """Per repeat of `level` (rows of summary.summarize_repeats), the side of the answer it reads:
    1 past it (the winner ahead, the objective missed), -1 before it, 0 when it cannot tell."""
    return [side * interval.past_sign
            for side in repeat_sides(by_repeat, level, interval.column, interval.ahead, interval.versus)]


def repeats_of(by_repeat: pd.DataFrame | None, level: float) -> int:
    """How many times `level` was measured (1 for a level without repeats or before any data)."""
    if by_repeat is None or by_repeat.empty:
        return 1
    found = by_repeat.loc[by_repeat["level"] == level, "repeat"]
    return int(found.max()) if len(found) else 1


def unconfirmed_end(interval: Interval, measured: Sequence[float], by_repeat: pd.DataFrame,
                    max_repeats: int) -> tuple[float, int] | None:
    """A bracket end to measure again, and its repeat number: an end is measured again with a fresh
    seed while its repeats, fewer than max_repeats, all read its side of the answer (below: before
    it, above: past it). max_repeats that agree confirm it. Two that disagree split it: the level
    lies in the answer's band, the analysis's bracket reaches past it (crossings.split_levels), and
    more repeats would only tip a weighted coin. None when both ends are done, or the estimate is
    a measured level."""
    found = interval.ends(measured)
    if found is None or found[0] == found[1]:
        return None
    for end, side in ((found[0], -1), (found[1], 1)):
        repeats = repeats_of(by_repeat, end)
        if repeats < max_repeats and all(s == side for s in level_sides(interval, by_repeat, end)):
            return end, repeats + 1
    return None


@dataclass(frozen=True)
class Decision:
    """What to do after a level: measure `level` next, or stop for `stop_reason`."""

    level: float | None
    stop_reason: str
    widest: Interval | None
    intervals: tuple[Interval, ...]
    repeat: int = 1  # above 1: measure `level` again, this time with a fresh seed

    def state(self, reason: str, levels: Sequence[float], repeats: Mapping[float, int], requests: int,
              traffic_s: float) -> AdaptiveState:
        """The report's "adaptive" after this decision: `reason` is why the sweep stops (the
        decision's own, or a budget the next level would overspend; "" to go on), `levels` those
        measured in the order first measured, `repeats` their measurements, `requests` and
        `traffic_s` what the sweep spent."""
        return AdaptiveState(
            next_level=self.level if not reason else None, next_repeat=self.repeat, stop_reason=reason,
            widest=self.widest.reported() if self.widest else None,
            intervals=tuple(i.reported() for i in self.intervals), levels=tuple(levels), requests=requests,
            repeats={level: n for level, n in repeats.items() if n > 1}, traffic_s=traffic_s)


def decide(report: CrossoverReport, adaptive: AdaptivePlan, plan: SweepPlan,
           measured: Sequence[float], by_repeat: pd.DataFrame | None = None) -> Decision:
    """The next level: up the range while an answer may lie above (with `by_repeat`, the rows of
    summary.summarize_repeats, once the highest level's repeats confirm it), then inside the
    widest interval first, then a repeat of a bracket end not yet confirmed; a stop reason when
    none is worth measuring."""
    found = tuple(intervals(report, adaptive))
    pending = open_above(report, adaptive)
    above = level_above(plan, measured) if pending else None
    if above is not None:
        if by_repeat is not None and adaptive.max_repeats > 1:
            repeat = unconfirmed_top(pending, measured, by_repeat, adaptive.max_repeats)
            if repeat is not None:
                return Decision(max(measured), "", None, found, repeat=repeat)
        return Decision(above, "", None, found)
    if not found:
        return Decision(None, "nothing-to-narrow", None, found)
    # An estimate is only as sure as the measured levels either side of it: the bootstrap holds each
    # level's noise, not a jump of the curves between two far levels.
    wide = sorted((i for i in found if i.width > adaptive.target_ci), key=lambda i: i.width, reverse=True)
    far = sorted((i for i in found if bracket_width(i, measured) > adaptive.target_ci),
                 key=lambda i: bracket_width(i, measured), reverse=True)
    for interval in [*wide, *(i for i in far if i not in wide)]:
        level = bracket_level(interval, measured, plan) if interval in far else None
        if level is None and interval in wide:
            level = level_inside(interval, measured, plan)
        if level is not None:
            return Decision(level, "", interval, found)
    if by_repeat is not None and adaptive.max_repeats > 1:
        for interval in sorted(found, key=lambda i: i.width, reverse=True):
            again = unconfirmed_end(interval, measured, by_repeat, adaptive.max_repeats)
            if again is not None:
                return Decision(again[0], "", interval, found, repeat=again[1])
    if not wide and not far:
        return Decision(None, "target", max(found, key=lambda i: i.width), found)
    return Decision(None, "resolution", (far or wide)[0], found)


def adaptive_line(state: AdaptiveState | None, axis: str) -> str:
    """One line from the report's adaptive state (None: no decision yet), on the load axis named
    `axis` (Mode.axis): the levels so far and the next one, or why the sweep stopped and the widest
    interval it left."""
    state = state if state is not None else AdaptiveState()
    repeats = state.repeats
    levels = ", ".join(f"{x:g}" + (f" (x{repeats[x]})" if repeats.get(x, 1) > 1 else "")
                       for x in state.levels) or "none"
    widest = state.widest
    what = widest.what if widest is not None else ""
    if state.next_level is not None:
        if state.next_repeat > 1:
            return (f"adaptive sweep: levels {levels} so far; next {axis} {state.next_level:g} again "
                    f"(repeat {state.next_repeat}, to confirm its side of the {what or 'answer'})")
        why = f"to narrow the {what}" if what else "an answer may lie above"
        return f"adaptive sweep: levels {levels} so far; next {axis} {state.next_level:g} ({why})"
    reason = STOP_REASONS.get(state.stop_reason, "stopped before the coarse start was measured")
    line = f"adaptive sweep stopped: {reason}; levels measured: {levels}"
    if widest is not None and widest.width is not None:
        line += (f"; widest interval: {widest.what} at {axis} {widest.x:.3g}, "
                 f"{widest.width:.0%} of it")
    return line
