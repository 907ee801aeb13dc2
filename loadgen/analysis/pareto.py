"""Throughput per GPU against interactivity: the Pareto view of a run's summary table.

Each (topology, level) row is one point: output tokens/s per GPU (the summary's
`output_tps_per_gpu`) against interactivity, one user's decode rate, slo.interactivity of the
level's median TPOT (a typical user's; the SLO judges the tail through attainment, drawn as the
points' fill). Every topology is one curve in rising load; slo.knee marks its knee and
slo.pareto_front the points no other beats on both axes. Where two curves cross, one topology gives
more tokens per GPU above an interactivity and the other below it: that interactivity is the
crossover in this plane. A TPOT SLO is an interactivity floor (1000 / tpot_ms tokens/s).

Pure: a summary table in (a sweep's, an imported run's, a merged one's: the same columns), plain
dataclasses out; the charts (crossover.app.charts.pareto_chart) draw them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import combinations

import numpy as np
import pandas as pd

from crossover import slo
from crossover.loadgen.analysis.summary import per_gpu

THROUGHPUT_COLUMN = per_gpu("output_tps")
TPOT_COLUMN = slo.percentile_column("tpot", slo.INTERACTIVITY_QUANTILE)


@dataclass(frozen=True)
class ParetoPoint:
    topology: str
    level: float
    throughput_per_gpu: float  # output tokens/s per GPU
    interactivity: float  # output tokens/s per user (1 / median TPOT)
    meets_objective: bool  # the level's attainment (every SLO) reaches the objective
    on_front: bool  # no point of any topology beats it on both axes
    knee: bool  # its topology's knee (slo.knee)


@dataclass(frozen=True)
class ParetoCrossing:
    """Where two topologies' curves cross: `above` gives more tokens/s per GPU at higher
    interactivity, `below` at lower."""

    above: str
    below: str
    interactivity: float
    throughput_per_gpu: float
    sentence: str


@dataclass(frozen=True)
class ParetoView:
    axis: str  # the load axis the curves run along ("concurrency" or "rate")
    points: tuple[ParetoPoint, ...]
    crossings: tuple[ParetoCrossing, ...]
    interactivity_floor: float | None  # tokens/s per user the TPOT SLO asks at least (None: no TPOT SLO)
    objective: float

    @property
    def sentences(self) -> list[str]:
        """The crossings', then each knee's."""
        knees = [f"{p.topology}'s knee is at {self.axis} {p.level:g}: past it a step gains less than "
                 f"{slo.KNEE_GAIN:.0%} more output tokens/s per GPU while each user decodes slower "
                 f"({p.throughput_per_gpu:,.4g} tokens/s per GPU, {p.interactivity:,.4g} tokens/s per user)"
                 for p in self.points if p.knee]
        return [c.sentence for c in self.crossings] + knees

    def frame(self) -> pd.DataFrame:
        columns = list(ParetoPoint.__dataclass_fields__)
        return pd.DataFrame([p.__dict__ for p in self.points], columns=columns)


def _curves(points: list[ParetoPoint]) -> dict[str, list[ParetoPoint]]:
    curves: dict[str, list[ParetoPoint]] = {}
    for p in points:
        curves.setdefault(p.topology, []).append(p)
    return curves


def _crossings(a: str, b: str, pa: list[ParetoPoint], pb: list[ParetoPoint]) -> list[ParetoCrossing]:
    """Sign changes of throughput per GPU as a function of interactivity, each curve linear between
    its points (sorted by interactivity), over the interactivities both curves span."""
    xa, ya = np.array([p.interactivity for p in pa]), np.array([p.throughput_per_gpu for p in pa])
    xb, yb = np.array([p.interactivity for p in pb]), np.array([p.throughput_per_gpu for p in pb])
    oa, ob = np.argsort(xa, kind="stable"), np.argsort(xb, kind="stable")
    xa, ya, xb, yb = xa[oa], ya[oa], xb[ob], yb[ob]
    low, high = max(xa[0], xb[0]), min(xa[-1], xb[-1])
    if len(pa) < 2 or len(pb) < 2 or not low < high:
        return []
    inside = [xa[(xa > low) & (xa < high)], xb[(xb > low) & (xb < high)]]
    grid = np.unique(np.concatenate([[low, high], *inside]))
    diff = np.interp(grid, xa, ya) - np.interp(grid, xb, yb)
    found: list[ParetoCrossing] = []
    last = None  # index of the last grid point off the crossing (diff not 0)
    for i, d in enumerate(diff):
        if d == 0:
            continue
        if last is not None and np.sign(d) != np.sign(diff[last]):
            d0 = diff[last]
            # the curves touch at a grid point between them, or cross between two neighbours
            x = grid[last + 1] if i > last + 1 else grid[last] + (grid[i] - grid[last]) * d0 / (d0 - d)
            above, below = (a, b) if d > 0 else (b, a)  # d: the difference past the crossing
            y = float(np.interp(x, xa, ya))
            found.append(ParetoCrossing(
                above, below, float(x), y,
                f"{above} gives more output tokens/s per GPU than {below} above {x:,.4g} tokens/s per "
                f"user (1 / TPOT), {below} below it (at {y:,.4g} tokens/s per GPU)"))
        last = i
    return found


def pareto_view(summary: pd.DataFrame, axis: str, slos_ms: Mapping[str, float],
                objective: float) -> ParetoView:
    """The Pareto view of a summary table (loadgen.analysis.summary.summarize's rows)."""
    floor = slo.interactivity(slos_ms["tpot"] / 1000.0) if "tpot" in slos_ms else None
    if summary is None or summary.empty or THROUGHPUT_COLUMN not in summary or TPOT_COLUMN not in summary:
        return ParetoView(axis, (), (), floor, objective)
    rows = summary.sort_values(["topology", "level"])
    raw = []
    for row in rows.to_dict("records"):
        x = float(row[THROUGHPUT_COLUMN])
        y = slo.interactivity(float(row[TPOT_COLUMN]) / 1000.0)
        if not (math.isfinite(x) and math.isfinite(y)):
            continue  # a level nothing finished at, or of one-token answers only
        attained = float(row.get(slo.attainment_column(), math.nan))
        raw.append((str(row["topology"]), float(row["level"]), x, y, attained >= objective))
    front = set(slo.pareto_front([(x, y) for _, _, x, y, _ in raw]))
    knees: set[int] = set()
    start = 0
    for topology in dict.fromkeys(t for t, *_ in raw):
        count = sum(1 for t, *_ in raw if t == topology)
        at = slo.knee([(x, y) for _, _, x, y, _ in raw[start:start + count]])
        if at is not None:
            knees.add(start + at)
        start += count
    points = [ParetoPoint(t, level, x, y, meets, i in front, i in knees)
              for i, (t, level, x, y, meets) in enumerate(raw)]
    curves = _curves(points)
    crossings = [c for a, b in combinations(sorted(curves), 2)
                 for c in _crossings(a, b, curves[a], curves[b])]
    return ParetoView(axis, tuple(points), tuple(crossings), floor, objective)
