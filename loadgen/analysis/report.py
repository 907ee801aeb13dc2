"""crossover.json, the crossover report: one typed object, written and read here only.

    axis, objective, slos_ms, bootstrap  what the analysis was asked (the load axis by its name)
    crossovers                           per metric and pair of topologies: where one overtakes the
                                         other, or that neither does in the range
    capacities                           per topology: the highest load that meets the objective
    sentences                            the crossovers' sentences, then the capacities'
    adaptive                             an adaptive sweep's latest decision (only in its runs)

`CrossoverReport.write` writes the file byte for byte as the versions before it did (the same keys
in the same order, a missing number as null where it always was). `CrossoverReport.read` reads any version's:
a field added later (brackets, repeats) takes its default, a metric name from before the unit
joined it (RENAMED) is read as today's, a key it does not know is left out. Plain data: the
analysis (crossings.analyze, loadgen.adaptive) makes and reads these objects; the sweep, `crossover
analyze`, the run folder and the app pass them on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from crossover import slo
from crossover.errors import UserError
from crossover.loadgen.analysis.results import write_json
from crossover.loadgen.plan import Mode

CROSSOVER_FILE = "crossover.json"

# The names before the unit joined them (docs/sweep.md): accepted as metric names, and read from old
# run folders, for one release.
RENAMED: dict[str, str] = {"goodput": slo.GOODPUT_REQUESTS, "token_goodput": slo.GOODPUT_TOKENS}

# Why an adaptive sweep stopped: one word each (the report's adaptive.stop_reason), and what the
# summary says about it.
STOP_REASONS = {
    "target": "every interval that matters, and the levels either side of it (confirmed by repeats), "
              "within --target-ci",
    "nothing-to-narrow": "no crossing of the metric and no capacity inside the range",
    "resolution": "every level inside the remaining intervals is measured already",
    "max-requests": "the next level would overspend --max-requests",
    "max-duration": "the next level would overspend --max-duration",
    "stopped": "stopped before the answer was as sure as asked",
}


def metric_named(name: str) -> str:
    """A metric's name, its old name (RENAMED) read as the new one."""
    return RENAMED.get(name, name)


def _number(value: Any) -> float | None:
    """A number as the file holds it (null: None); a whole number stays one, so it writes back alike."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    return float(value)


def _text(value: Any) -> str:
    return "" if value is None else str(value)


@dataclass(frozen=True)
class Crossover:
    """One crossing of two topologies' curves, or the statement that there is none.

    kind: "crossing" (x is where `winner` overtakes `loser`), "none" (no crossing in the range:
    `winner` leads throughout), "insufficient" (fewer than two common levels).
    """

    topology_a: str
    topology_b: str
    metric: str
    axis: Mode  # the load axis (in the file: its name, Mode.axis)
    kind: str
    x: float | None
    ci_low: float | None
    ci_high: float | None
    direction: str  # "b_overtakes_a", "a_overtakes_b", "a_leads", "b_leads" or ""
    winner: str
    loser: str
    crossings: int  # how many times the point-estimate curves cross in the range
    support: float  # share of bootstrap resamples that cross (in this direction), NaN without one
    level_range: tuple[float, float]
    sentence: str
    bracket_low: float | None = None  # the measured levels either side of x (crossings.bracket)
    bracket_high: float | None = None

    def to_json(self) -> dict[str, Any]:
        data = {**asdict(self), "axis": self.axis.axis, "level_range": list(self.level_range)}
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in data.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], axis: Mode = Mode.CLOSED) -> Crossover:
        """One of crossover.json's "crossovers", of any version; `axis` the report's, if it has none."""
        span = data.get("level_range") or (math.nan, math.nan)
        support = _number(data.get("support"))
        return cls(
            topology_a=_text(data.get("topology_a")), topology_b=_text(data.get("topology_b")),
            metric=metric_named(_text(data.get("metric"))),
            axis=Mode.of_axis(data["axis"]) if data.get("axis") else axis, kind=_text(data.get("kind")),
            x=_number(data.get("x")), ci_low=_number(data.get("ci_low")),
            ci_high=_number(data.get("ci_high")),
            direction=_text(data.get("direction")), winner=_text(data.get("winner")),
            loser=_text(data.get("loser")), crossings=int(data.get("crossings") or 0),
            support=math.nan if support is None else support,
            level_range=(math.nan if span[0] is None else span[0], math.nan if span[1] is None else span[1]),
            sentence=_text(data.get("sentence")), bracket_low=_number(data.get("bracket_low")),
            bracket_high=_number(data.get("bracket_high")))


@dataclass(frozen=True)
class Capacity:
    """The highest load at which a topology still meets the goodput objective (DistServe)."""

    topology: str
    axis: Mode  # the load axis (in the file: its name, Mode.axis)
    objective: float
    x: float | None  # None when even the lowest level misses the objective
    ci_low: float | None
    ci_high: float | None
    censored: str  # "" (found inside the range), "above" (meets it at every level), "below"
    per_gpu: float | None
    sentence: str
    bracket_low: float | None = None  # the measured levels either side of x (crossings.bracket)
    bracket_high: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "axis": self.axis.axis}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], axis: Mode = Mode.CLOSED,
                  objective: float = math.nan) -> Capacity:
        """One of crossover.json's "capacities", of any version; `axis` and `objective` the report's,
        if it has none."""
        found = _number(data.get("objective"))
        return cls(
            topology=_text(data.get("topology")),
            axis=Mode.of_axis(data["axis"]) if data.get("axis") else axis,
            objective=objective if found is None else found, x=_number(data.get("x")),
            ci_low=_number(data.get("ci_low")), ci_high=_number(data.get("ci_high")),
            censored=_text(data.get("censored")), per_gpu=_number(data.get("per_gpu")),
            sentence=_text(data.get("sentence")), bracket_low=_number(data.get("bracket_low")),
            bracket_high=_number(data.get("bracket_high")))


@dataclass(frozen=True)
class ReportedInterval:
    """An interval an adaptive sweep narrows, as its decision reports it (adaptive.Interval)."""

    what: str  # e.g. "goodput_requests_per_second crossing tp4x1/tp2x2" or "capacity tp4x1"
    x: float
    low: float | None = None
    high: float | None = None
    width: float | None = None  # (high - low) / x; None without an interval

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReportedInterval:
        x = _number(data.get("x"))
        return cls(_text(data.get("what")), math.nan if x is None else x, _number(data.get("low")),
                   _number(data.get("high")), _number(data.get("width")))


@dataclass(frozen=True)
class AdaptiveState:
    """An adaptive sweep's latest decision (crossover.json's "adaptive"): the next level (and which
    measurement of it), or why the sweep stopped; the intervals it narrows and the widest; the
    levels in the order first measured, those measured more than once, and what it spent."""

    next_level: float | None = None
    next_repeat: int = 1
    stop_reason: str = ""  # a key of STOP_REASONS, "" while the sweep goes on
    widest: ReportedInterval | None = None
    intervals: tuple[ReportedInterval, ...] = ()
    levels: tuple[float, ...] = ()
    requests: int = 0
    repeats: dict[float, int] = field(default_factory=dict)  # level: measurements, for those above 1
    traffic_s: float = 0.0

    @property
    def stop_sentence(self) -> str:
        return STOP_REASONS.get(self.stop_reason, "")

    def to_json(self) -> dict[str, Any]:
        return {"next_level": self.next_level, "next_repeat": self.next_repeat,
                "stop_reason": self.stop_reason, "stop_sentence": self.stop_sentence,
                "widest": self.widest.to_json() if self.widest is not None else None,
                "intervals": [i.to_json() for i in self.intervals], "levels": list(self.levels),
                "requests": self.requests, "repeats": {f"{x:g}": n for x, n in self.repeats.items()},
                "traffic_s": self.traffic_s}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AdaptiveState:
        levels = tuple(float(x) for x in data.get("levels") or ())
        named = {f"{x:g}": x for x in levels}  # the file names a level as f"{level:g}"
        widest = data.get("widest")
        return cls(
            next_level=_number(data.get("next_level")), next_repeat=int(data.get("next_repeat") or 1),
            stop_reason=_text(data.get("stop_reason")),
            widest=ReportedInterval.from_json(widest) if widest else None,
            intervals=tuple(ReportedInterval.from_json(i) for i in data.get("intervals") or ()),
            levels=levels, requests=int(data.get("requests") or 0),
            repeats={named.get(key, float(key)): int(n) for key, n in (data.get("repeats") or {}).items()},
            traffic_s=_number(data.get("traffic_s")) or 0.0)


@dataclass(frozen=True)
class CrossoverReport:
    """Everything crossover.json holds (see the module's docstring); the default one has nothing yet."""

    axis: Mode = Mode.CLOSED  # the load axis (in the file: its name, Mode.axis)
    objective: float = math.nan
    slos_ms: dict[str, float] = field(default_factory=dict)
    bootstrap: int = 0  # resamples behind the intervals
    crossovers: tuple[Crossover, ...] = ()
    capacities: tuple[Capacity, ...] = ()
    adaptive: AdaptiveState | None = None

    @property
    def sentences(self) -> list[str]:
        """Each crossover's sentence, then each capacity's."""
        return [c.sentence for c in self.crossovers] + [c.sentence for c in self.capacities]

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "axis": self.axis.axis, "objective": self.objective, "slos_ms": self.slos_ms,
            "bootstrap": self.bootstrap, "crossovers": [c.to_json() for c in self.crossovers],
            "capacities": [c.to_json() for c in self.capacities], "sentences": self.sentences}
        if self.adaptive is not None:
            data["adaptive"] = self.adaptive.to_json()
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CrossoverReport:
        """The report in a crossover.json of any version (see the module's docstring)."""
        axis = Mode.of_axis(data["axis"]) if data.get("axis") else Mode.CLOSED
        found = _number(data.get("objective"))
        objective = math.nan if found is None else found
        adaptive = data.get("adaptive")
        return cls(
            axis=axis, objective=objective, slos_ms=dict(data.get("slos_ms") or {}),
            bootstrap=int(data.get("bootstrap") or 0),
            crossovers=tuple(Crossover.from_json(c, axis) for c in data.get("crossovers") or ()),
            capacities=tuple(Capacity.from_json(c, axis, objective) for c in data.get("capacities") or ()),
            adaptive=AdaptiveState.from_json(adaptive) if isinstance(adaptive, Mapping) else None)

    def write(self, folder: Path) -> None:
        """folder/crossover.json, replaced whole (never half written)."""
        write_json(folder / CROSSOVER_FILE, self.to_json())

    @classmethod
    def read(cls, folder: Path) -> CrossoverReport | None:
        """folder/crossover.json, None when there is none; UserError when it cannot be read."""
        path = folder / CROSSOVER_FILE
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, Mapping):
                raise ValueError("not a JSON object")
            return cls.from_json(data)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:
            raise UserError(f"{path}: cannot read it ({exc})") from None
