"""Where one topology overtakes another, with a bootstrap interval, and each topology's capacity.

Each topology's metric-vs-load curve is interpolated with monotone PCHIP (scipy) on a log2
concurrency axis (or a linear rate axis); the difference of two curves is scanned on a fine grid
and every sign change refined with brentq. Two topologies measured at other levels (GuideLLM's
sweep: each run at its own achieved rate) are compared at the union of their levels inside both
ranges, each curve taken linearly between its own neighbouring levels (see Curves). A bootstrap
resamples each (topology, level)'s requests with replacement, recomputes the metric and the
crossing, and gives the interval.
Throughput and goodput are compared per GPU, so topologies of different sizes compare fairly.
`analyze` gathers it all in a CrossoverReport (loadgen.report: crossover.json). Pure functions of
DataFrames: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd
from scipy.interpolate import PchipInterpolator
from scipy.optimize import brentq

from crossover import slo
from crossover.loadgen.analysis.report import Capacity, Crossover, CrossoverReport, metric_named
from crossover.loadgen.analysis.summary import (
    mark_requests,
    per_gpu,
    request_itls,
    request_latencies,
    summarize_repeats,
)
from crossover.loadgen.plan import Mode, SweepPlan


@dataclass(frozen=True)
class ComparedMetric:
    """A summary column compared between topologies along the load axis (not a vLLM metric: those
    are the catalog's)."""

    name: str
    column: str  # summary column
    higher_is_better: bool
    label: str
    kind: str | None = None  # the SLO kind of a latency quantile (compared at slo.TAIL_QUANTILE)


def _tail_latency(kind: str) -> ComparedMetric:
    """The tail quantile of one SLO kind's latency, named as its summary column without the unit."""
    label = slo.percentile_label(slo.TAIL_QUANTILE)
    return ComparedMetric(f"{kind}_{label}", slo.percentile_column(kind, slo.TAIL_QUANTILE), False,
                          f"{label} {kind.upper()}", kind)


_TAIL_LATENCIES = tuple(_tail_latency(kind) for kind in slo.TAIL_KINDS)
METRICS: dict[str, ComparedMetric] = {m.name: m for m in (
    ComparedMetric("output_tps", per_gpu("output_tps"), True, "output tokens/s per GPU"),
    ComparedMetric(slo.GOODPUT_REQUESTS, per_gpu(slo.GOODPUT_REQUESTS), True, "goodput"),
    ComparedMetric(slo.GOODPUT_TOKENS, per_gpu(slo.GOODPUT_TOKENS), True, "token goodput"),
    *_TAIL_LATENCIES,
)}
DEFAULT_METRICS = ("output_tps", slo.GOODPUT_REQUESTS, *(m.name for m in _TAIL_LATENCIES))


def bracket(levels: Sequence[float], x: float, split: Set[float] = frozenset()) -> tuple[float, float] | None:
    """The measured levels nearest x either side of it (x twice when it was measured): where the
    curves were seen on each side of an answer. Interpolation between them cannot see a step of the
    curves (p99 ITL once prefills stall decodes), so the answer may lie anywhere in between, however
    narrow the bootstrap interval. A `split` level (see split_levels) bounds nothing: the bracket
    reaches past it, to the farthest measured level on that side when no other is left. None when x
    lies outside the measured levels. The one bracket search, on plain numbers: the analysis's
    answers name it, and the adaptive sweep narrows it (adaptive.Interval.ends)."""
    below = [v for v in levels if v <= x]
    above = [v for v in levels if v >= x]
    if not below or not above:
        return None
    return (max([v for v in below if v not in split] or [min(below)]),
            min([v for v in above if v not in split] or [max(above)]))


def repeat_sides(by_repeat: pd.DataFrame, level: float, column: str, mine: str,
                 versus: str | float) -> list[int]:
    """Per repeat of `level` (rows of summary.summarize_repeats), the sign of `mine`'s `column` minus
    `versus`'s (another topology's, or a number such as the objective); 0 where one is missing."""
    rows = by_repeat[by_repeat["level"] == level]
    values = rows[rows["topology"] == mine].set_index("repeat")[column]
    if isinstance(versus, str):
        other = rows[rows["topology"] == versus].set_index("repeat")[column].reindex(values.index)
    else:
        other = pd.Series(versus, index=values.index)
    return [int(np.sign(d)) if math.isfinite(d) else 0 for d in (values - other).sort_index()]


def split_levels(by_repeat: pd.DataFrame | None, column: str, mine: str, versus: str | float) -> set[float]:
    """The levels measured more than once whose repeats read `mine`'s `column` on both sides of
    `versus`'s: each repeat is another arrival sequence, and near a jump of a tail quantile (p99
    ITL once a stall enters its 1% tail) one sequence reads either side by chance. Such a level
    lies in the answer's band, and pooling its repeats only picks a side by a weighted coin."""
    if by_repeat is None or by_repeat.empty:
        return set()
    most = by_repeat.groupby("level")["repeat"].max()
    return {float(level) for level in most[most > 1].index
            if {-1, 1} <= set(repeat_sides(by_repeat, float(level), column, mine, versus))}


def _interval_text(ci: tuple[float | None, float | None], between: tuple[float, float] | None,
                   mode: Mode) -> str:
    parts = []
    if ci[0] is not None and ci[1] is not None:
        parts.append(f"95% CI {format_load(ci[0], mode)}-{format_load(ci[1], mode)}")
    if between is not None and between[0] < between[1]:
        parts.append(f"between levels {format_load(between[0], mode)} and {format_load(between[1], mode)}")
    return f" ({', '.join(parts)})" if parts else ""


def format_load(x: float, mode: Mode) -> str:
    if mode is Mode.CLOSED:
        return f"{x:.0f}" if x >= 9.5 else f"{x:.2g}"
    return f"{x:.2g}" if x < 100 else f"{x:.0f}"


def _roots(u: np.ndarray, ya: np.ndarray, yb: np.ndarray) -> list[tuple[float, int]]:
    """Sign changes of PCHIP(ya) - PCHIP(yb) on the grid u: (root, sign after the root)."""
    fa, fb = PchipInterpolator(u, ya), PchipInterpolator(u, yb)

    def diff(v: float) -> float:
        return float(fa(v) - fb(v))

    grid = np.linspace(u[0], u[-1], 64 * len(u))
    values = fa(grid) - fb(grid)
    scale = max(float(np.nanmax(np.abs(np.concatenate([ya, yb])))), 1e-12)
    signs = np.where(np.abs(values) <= 1e-9 * scale, 0, np.sign(values))
    roots: list[tuple[float, int]] = []
    last_sign, last_index = 0, 0
    for i, s in enumerate(signs):
        if s == 0:
            continue
        if last_sign and s != last_sign:
            lo, hi = grid[last_index], grid[i]
            root = brentq(diff, lo, hi) if diff(lo) * diff(hi) < 0 else (lo + hi) / 2
            roots.append((float(root), int(s)))
        last_sign, last_index = int(s), i
    return roots


def _lead_sign(ya: np.ndarray, yb: np.ndarray) -> int:
    return int(np.sign(np.nanmean(ya - yb)))


def _curve_sentence(metric: ComparedMetric, mode: Mode, a: str, b: str, roots: list[tuple[float, int]],
                    ci: list[tuple[float | None, float | None]], lead: int,
                    span: tuple[float, float], brackets: Sequence[tuple[float, float] | None]) -> list[str]:
    better_when = 1 if metric.higher_is_better else -1
    axis = mode.axis
    lo, hi = format_load(span[0], mode), format_load(span[1], mode)
    if not roots:
        leader, other = (a, b) if lead * better_when > 0 else (b, a)
        if lead == 0:
            return [f"{a} and {b} are level in {metric.label} over {axis} {lo}-{hi} (no crossing in range)"]
        return [f"{leader} stays ahead of {other} in {metric.label} over {axis} {lo}-{hi} "
                f"(no crossing in range)"]
    sentences = []
    for n, ((u, sign_after), (c_lo, c_hi), between) in enumerate(zip(roots, ci, brackets, strict=True), 1):
        winner, loser = (a, b) if sign_after * better_when > 0 else (b, a)
        x = mode.unscale(u)
        interval = _interval_text((c_lo, c_hi), between, mode)
        text = (f"{winner} overtakes {loser} in {metric.label} at {axis} about "
                f"{format_load(x, mode)}{interval}")
        if len(roots) > 1:
            text += f"; the curves cross more than once ({len(roots)} times in {axis} {lo}-{hi}), " \
                    f"this is crossing {n}"
        sentences.append(text)
    return sentences


def _metric_replicates(group: pd.DataFrame, metric: ComparedMetric, duration: float, gpus: int, level: float,
                       closed_loop: bool, indices: np.ndarray) -> np.ndarray:
    """The metric recomputed for each row of `indices` (B x n resamples of the counted requests)."""
    if len(group) == 0:
        return np.full(len(indices), np.nan)
    ok = group["ok"].to_numpy(bool)
    if metric.name in ("output_tps", slo.GOODPUT_REQUESTS, slo.GOODPUT_TOKENS):
        tokens = group["output_tokens"].to_numpy(float) * ok
        good = group["good"].to_numpy(float)
        amounts = {"output_tps": tokens, slo.GOODPUT_REQUESTS: good, slo.GOODPUT_TOKENS: tokens * good}
        amount = amounts[metric.name]
        if closed_loop:
            # Little's law, as in the summary: level x resampled work / resampled time in flight.
            elapsed = (group["end_time"] - group["send_time"]).to_numpy(float)
            return level * amount[indices].sum(axis=1) / elapsed[indices].sum(axis=1) / gpus
        per_gpu_rate = 1.0 / (duration * gpus) if duration > 0 else np.nan
        return amount[indices].sum(axis=1) * per_gpu_rate
    if metric.name == slo.ATTAINMENT:
        return group["good"].to_numpy(float)[indices].mean(axis=1)
    if metric.kind in ("ttft", "tpot"):
        picked = request_latencies(group, metric.kind)[indices]
        out = np.full(len(indices), np.nan)
        has = np.isfinite(picked).any(axis=1)
        if has.any():
            out[has] = np.nanpercentile(picked[has], slo.TAIL_QUANTILE * 100, axis=1) * 1000.0
        return out
    if metric.kind == "itl":
        # Pooled over tokens: a resample repeats each request's ITLs as often as it drew the
        # request, so a replicate's quantile is a weighted quantile of all ITLs sorted once (weight
        # = draws of the owning request). Only the top few per cent can hold the p99: scan those.
        itls = request_itls(group)
        out = np.full(len(indices), np.nan)
        lengths = np.array([len(v) for v in itls], dtype=float)
        if not lengths.sum():
            return out
        values = np.concatenate(itls)
        owner = np.repeat(np.arange(len(itls)), lengths.astype(int))
        order = np.argsort(values, kind="stable")[::-1]  # largest first
        values, owner = values[order], owner[order]
        draws = np.zeros((len(indices), len(itls)))
        np.add.at(draws, (np.repeat(np.arange(len(indices)), indices.shape[1]), indices.ravel()), 1.0)
        above = (1.0 - slo.TAIL_QUANTILE) * (draws @ lengths)  # weight that lies above the quantile
        top = min(values.size, max(256, values.size // 20))
        tail = np.cumsum(draws[:, owner[:top]], axis=1)
        covered = (tail[:, -1] >= above) & (above > 0)
        out[covered] = values[np.argmax(tail[covered] >= above[covered, None], axis=1)] * 1000.0
        for b in np.nonzero(~covered & (above > 0))[0]:  # a resample dominated by a few requests
            pooled = np.concatenate([itls[i] for i in indices[b]])
            out[b] = np.percentile(pooled, slo.TAIL_QUANTILE * 100) * 1000.0
        return out
    raise KeyError(metric.name)


def _bootstrap(marked: pd.DataFrame, summary: pd.DataFrame, topology: str, metric: ComparedMetric,
               levels: np.ndarray, n_boot: int, rng: np.random.Generator, closed_loop: bool) -> np.ndarray:
    out = np.full((len(levels), n_boot), np.nan)
    mine = marked[(marked["topology"] == topology) & marked["counted"]]
    rows = summary[summary["topology"] == topology].set_index("level")
    for i, level in enumerate(levels):
        group = mine[mine["level"] == level]
        if not len(group):
            continue
        indices = rng.integers(0, len(group), size=(n_boot, len(group)))
        out[i] = _metric_replicates(group, metric, float(rows.at[level, "duration_s"]),  # type: ignore[arg-type]
                                    int(rows.at[level, "gpus"]), float(level),  # type: ignore[arg-type]
                                    closed_loop, indices)
    return out


_ATTAINMENT = ComparedMetric(slo.ATTAINMENT, slo.attainment_column(), True, "SLO attainment")


@dataclass(frozen=True)
class Curves:
    """Two topologies' metric on the levels they are compared at, and the levels each was measured
    at. Where both measured the same levels inside the range they share, `levels` are those and the
    values are as measured (own_a and own_b are `levels`). Otherwise `levels` is the union of both
    topologies' levels inside both ranges and each curve is linear on the axis between its own
    neighbouring levels: a level one topology lacks is an estimate from its neighbours, and a
    crossing's bracket reaches to the levels each topology was seen at (Curves.between)."""

    levels: np.ndarray
    a: np.ndarray
    b: np.ndarray
    own_a: np.ndarray
    own_b: np.ndarray

    @property
    def shared(self) -> bool:
        return self.own_a is self.levels and self.own_b is self.levels

    def onto(self, mode: Mode, own: np.ndarray, values: np.ndarray) -> np.ndarray:
        """`values` at `own` levels (rows; columns are bootstrap replicates) at the compared levels:
        the same rows when shared, else each column linear between its finite neighbours."""
        if own is self.levels:
            return values
        at, have = mode.scale(self.levels), mode.scale(own)
        out = np.full((len(self.levels), values.shape[1]), np.nan)
        for r in range(values.shape[1]):
            keep = np.isfinite(values[:, r])
            if keep.sum() >= 2 and have[keep][0] <= at[0] and at[-1] <= have[keep][-1]:
                out[:, r] = np.interp(at, have[keep], values[keep, r])
        return out

    def between(self, x: float, split: Set[float]) -> tuple[float, float] | None:
        """The bracket of x: crossings.bracket of the levels measured, reaching to both
        topologies' when they differ (either curve may step anywhere between its own levels)."""
        if self.shared:
            return bracket(list(self.levels), x, split)
        ends = [bracket(list(own), x, split) for own in (self.own_a, self.own_b)]
        if ends[0] is None or ends[1] is None:
            return None
        return (min(ends[0][0], ends[1][0]), max(ends[0][1], ends[1][1]))


def _curves(summary: pd.DataFrame, a: str, b: str, column: str, mode: Mode) -> Curves:
    left = summary[summary["topology"] == a].set_index("level")[column].sort_index()
    right = summary[summary["topology"] == b].set_index("level")[column].sort_index()
    lo = max(left.index.min(), right.index.min()) if len(left) and len(right) else math.inf
    hi = min(left.index.max(), right.index.max()) if len(left) and len(right) else -math.inf
    inside = [{float(v) for v in side.index if lo <= v <= hi} for side in (left, right)]
    if inside[0] == inside[1]:
        # the same levels: compared as measured, a level either lacks data at left out
        joined = pd.concat([left.rename("a"), right.rename("b")], axis=1, join="inner").dropna().sort_index()
        levels = joined.index.to_numpy(float)
        return Curves(levels, joined["a"].to_numpy(float), joined["b"].to_numpy(float), levels, levels)
    left, right = left.dropna(), right.dropna()
    own_a, own_b = left.index.to_numpy(float), right.index.to_numpy(float)
    if not len(own_a) or not len(own_b):
        empty = np.array([], dtype=float)
        return Curves(empty, empty, empty, own_a, own_b)
    lo, hi = max(own_a[0], own_b[0]), min(own_a[-1], own_b[-1])
    levels = np.array(sorted({float(v) for v in (*own_a, *own_b) if lo <= v <= hi}), dtype=float)
    at = mode.scale(levels)
    return Curves(levels, np.interp(at, mode.scale(own_a), left.to_numpy(float)),
                  np.interp(at, mode.scale(own_b), right.to_numpy(float)), own_a, own_b)


def find_crossovers(summary: pd.DataFrame, requests: pd.DataFrame | None, metric: str, *,
                    mode: Mode = Mode.CLOSED, slos_ms: Mapping[str, float] | None = None,
                    plan: SweepPlan | None = None, pairs: Sequence[tuple[str, str]] | None = None,
                    n_boot: int = 200, confidence: float = 0.95, seed: int = 0,
                    by_repeat: pd.DataFrame | None = None) -> list[Crossover]:
    """Every crossing of every pair of topologies' `metric` curves (see METRICS), with bootstrap
    intervals from the per-request data (pass requests=None to skip the bootstrap), and one
    "none"/"insufficient" result for a pair that does not cross in the range. `by_repeat`
    (summary.summarize_repeats) tells the split levels that bound no crossing."""
    metric = metric_named(metric)
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r} (have {', '.join(METRICS)})")
    spec = METRICS[metric]
    topologies = list(summary["topology"].unique()) if len(summary) else []
    pair_list = list(pairs) if pairs is not None else list(combinations(topologies, 2))
    marked = None
    if requests is not None and n_boot > 0 and len(requests):
        marked = requests if "good" in requests and "counted" in requests else mark_requests(
            requests, slos_ms or {}, plan)
    results: list[Crossover] = []
    tail = (1 - confidence) / 2 * 100
    for a, b in pair_list:
        curves = _curves(summary, a, b, spec.column, mode)
        levels, ya, yb = curves.levels, curves.a, curves.b
        span = (float(levels[0]), float(levels[-1])) if len(levels) else (math.nan, math.nan)
        if len(levels) < 2:
            results.append(Crossover(a, b, metric, mode, "insufficient", None, None, None, "", "", "", 0,
                                     math.nan, span, f"{a} vs {b} in {spec.label}: fewer than two common "
                                     f"levels with data, no crossing can be computed"))
            continue
        u = mode.scale(levels)
        roots = _roots(u, ya, yb)
        lead = _lead_sign(ya, yb)
        intervals: list[tuple[float | None, float | None]] = [(None, None)] * len(roots)
        supports = [math.nan] * len(roots)
        if marked is not None:
            rng = np.random.default_rng(seed)
            closed = mode is Mode.CLOSED
            boot_a = curves.onto(mode, curves.own_a,
                                 _bootstrap(marked, summary, a, spec, curves.own_a, n_boot, rng, closed))
            boot_b = curves.onto(mode, curves.own_b,
                                 _bootstrap(marked, summary, b, spec, curves.own_b, n_boot, rng, closed))
            found: list[list[float]] = [[] for _ in roots]
            for r in range(n_boot):
                ra, rb = boot_a[:, r], boot_b[:, r]
                keep = np.isfinite(ra) & np.isfinite(rb)
                if keep.sum() < 2:
                    continue
                replicate = _roots(u[keep], ra[keep], rb[keep])
                for k, (root, sign_after) in enumerate(roots):
                    same = [x for x, s in replicate if s == sign_after]
                    if same:
                        found[k].append(min(same, key=lambda x, root=root: abs(x - root)))  # type: ignore[misc]
            for k, values in enumerate(found):
                supports[k] = len(values) / n_boot
                if values:
                    lo, hi = np.percentile(values, [tail, 100 - tail])
                    # a skewed bootstrap can leave the estimate itself outside the percentile
                    # interval; a reader expects "about X (CI a-b)" to have a <= X <= b
                    root = roots[k][0]
                    intervals[k] = (mode.unscale(min(float(lo), root)), mode.unscale(max(float(hi), root)))
        split = split_levels(by_repeat, spec.column, a, b)
        brackets = [curves.between(mode.unscale(root), split) for root, _ in roots]
        sentences = _curve_sentence(spec, mode, a, b, roots, intervals, lead, span, brackets)
        better_when = 1 if spec.higher_is_better else -1
        if not roots:
            winner, loser = (a, b) if lead * better_when >= 0 else (b, a)
            results.append(Crossover(a, b, metric, mode, "none", None, None, None,
                                     "a_leads" if winner == a else "b_leads", winner, loser, 0, math.nan,
                                     span, sentences[0]))
            continue
        for (root, sign_after), (c_lo, c_hi), support, sentence in zip(roots, intervals, supports, sentences,
                                                                        strict=True):
            winner, loser = (a, b) if sign_after * better_when > 0 else (b, a)
            x = mode.unscale(root)
            between = curves.between(x, split) or (None, None)
            results.append(Crossover(a, b, metric, mode, "crossing", x, c_lo, c_hi,
                                     "a_overtakes_b" if winner == a else "b_overtakes_a", winner, loser,
                                     len(roots), support, span, sentence, *between))
    return results


def _capacity_point(u: np.ndarray, attainment: np.ndarray, objective: float) -> tuple[float, str]:
    """Highest u with PCHIP(attainment) >= objective on the grid, refined; censoring flag."""
    meets = attainment >= objective
    if meets.all():
        return float(u[-1]), "above"
    if not meets[0]:
        return float(u[0]), "below"
    curve = PchipInterpolator(u, attainment)
    grid = np.linspace(u[0], u[-1], 64 * len(u))
    ok = curve(grid) >= objective
    last = int(np.nonzero(ok)[0].max()) if ok.any() else 0
    if last >= len(grid) - 1:
        return float(u[-1]), "above"
    lo, hi = grid[last], grid[last + 1]
    f_lo, f_hi = float(curve(lo)) - objective, float(curve(hi)) - objective
    if f_lo * f_hi >= 0:
        return float(lo), ""

    def excess(v: float) -> float:
        return float(curve(v)) - objective

    return float(brentq(excess, lo, hi)), ""


def max_load_meeting_objective(summary: pd.DataFrame, requests: pd.DataFrame | None, objective: float, *,
                               mode: Mode = Mode.CLOSED, slos_ms: Mapping[str, float] | None = None,
                               plan: SweepPlan | None = None, n_boot: int = 200, confidence: float = 0.95,
                               seed: int = 0, by_repeat: pd.DataFrame | None = None) -> list[Capacity]:
    """Per topology, the highest load whose joint SLO attainment still meets `objective`
    (`by_repeat` as find_crossovers')."""
    out: list[Capacity] = []
    marked = None
    if requests is not None and n_boot > 0 and len(requests):
        marked = requests if "good" in requests and "counted" in requests else mark_requests(
            requests, slos_ms or {}, plan)
    tail = (1 - confidence) / 2 * 100
    for topology in sorted(summary["topology"].unique()) if len(summary) else []:
        rows = (summary[summary["topology"] == topology].dropna(subset=[slo.attainment_column()])
                .sort_values("level"))
        levels = rows["level"].to_numpy(float)
        gpus = int(rows["gpus"].iloc[0]) if len(rows) else 1
        pct = f"{objective:.0%}".replace(".0%", "%")
        if len(levels) == 0:
            out.append(Capacity(topology, mode, objective, None, None, None, "below", None,
                                f"{topology}: no level with data"))
            continue
        u = mode.scale(levels)
        attainment = rows[slo.attainment_column()].to_numpy(float)
        if len(levels) == 1:
            point, censored = (float(u[0]), "above") if attainment[0] >= objective else (float(u[0]), "below")
        else:
            point, censored = _capacity_point(u, attainment, objective)
        ci: tuple[float | None, float | None] = (None, None)
        if marked is not None and len(levels) >= 2:
            rng = np.random.default_rng(seed)
            boot = _bootstrap(marked, summary, topology, _ATTAINMENT, levels, n_boot, rng,
                              mode is Mode.CLOSED)
            points = [_capacity_point(u, boot[:, r], objective)[0] for r in range(n_boot)
                      if np.isfinite(boot[:, r]).all()]
            if points:
                lo, hi = np.percentile(points, [tail, 100 - tail])
                ci = (mode.unscale(min(float(lo), point)), mode.unscale(max(float(hi), point)))
        x = mode.unscale(point)
        split = split_levels(by_repeat, slo.attainment_column(), topology, objective)
        between = bracket(list(levels), x, split) if not censored else None
        interval = _interval_text(ci, between, mode)
        axis = mode.axis
        if censored == "below":
            sentence = (f"{topology} misses the {pct} SLO objective already at {axis} "
                        f"{format_load(x, mode)}, the lowest level tried")
            out.append(Capacity(topology, mode, objective, None, ci[0], ci[1], censored, None, sentence))
            continue
        if censored == "above":
            sentence = (f"{topology} meets the {pct} SLO objective at every level tried, up to {axis} "
                        f"{format_load(x, mode)} ({format_load(x / gpus, mode)} per GPU)")
        else:
            sentence = (f"{topology} meets the {pct} SLO objective up to {axis} about "
                        f"{format_load(x, mode)}{interval}, {format_load(x / gpus, mode)} per GPU")
        out.append(Capacity(topology, mode, objective, x, ci[0], ci[1], censored, x / gpus, sentence,
                            *(between or (None, None))))
    return out


def analyze(summary: pd.DataFrame, requests: pd.DataFrame | None, *, mode: Mode, objective: float,
            slos_ms: Mapping[str, float], plan: SweepPlan | None = None,
            metrics: Sequence[str] = DEFAULT_METRICS, n_boot: int = 200, seed: int = 0,
            order: Sequence[str] | None = None, by_repeat: pd.DataFrame | None = None) -> CrossoverReport:
    """Everything crossover.json holds: crossings per metric and pair (pairs in `order`, e.g. the
    spec's topology order), and capacities. `by_repeat`: summary.summarize_repeats of `requests`,
    when the caller has it already."""
    marked = mark_requests(requests, slos_ms, plan) if requests is not None and len(requests) else None
    if by_repeat is None and requests is not None and len(requests):
        gpus = {str(t): int(n) for t, n in summary.groupby("topology")["gpus"].first().items()}
        by_repeat = summarize_repeats(requests, slos_ms, gpus, plan, pooled=summary)
    present = set(summary["topology"]) if len(summary) else set()
    pairs = list(combinations([t for t in order if t in present], 2)) if order is not None else None
    crossings = [c for metric in metrics for c in find_crossovers(
        summary, marked, metric, mode=mode, slos_ms=slos_ms, plan=plan, pairs=pairs, n_boot=n_boot,
        seed=seed, by_repeat=by_repeat)]
    capacities = max_load_meeting_objective(summary, marked, objective, mode=mode, slos_ms=slos_ms, plan=plan,
                                            n_boot=n_boot, seed=seed, by_repeat=by_repeat)
    return CrossoverReport(axis=mode, objective=objective, slos_ms=dict(slos_ms), bootstrap=n_boot,
                           crossovers=tuple(crossings), capacities=tuple(capacities))
