"""What the page shows about one sweep, live or past, as plain data: the page only lays it out.

A `ResultsView` comes either from the background runner's latest status (a sweep in progress) or
from a run folder opened with loadgen's `load_run`; both give the same summary, requests and
crossover report, so the charts, sentences, table and downloads have one code path.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from crossover import slo
from crossover.app.charts import CrossoverMark
from crossover.app.runner import RunStatus
from crossover.errors import UserError
from crossover.loadgen.analysis.crossings import METRICS
from crossover.loadgen.analysis.pareto import ParetoView, pareto_view
from crossover.loadgen.analysis.report import Crossover, CrossoverReport
from crossover.loadgen.analysis.results import Run, read_info, read_server_views
from crossover.loadgen.analysis.summary import per_gpu, turn_summary

# the order sentences are listed in: the question the app answers first
METRIC_ORDER = (slo.GOODPUT_REQUESTS, slo.GOODPUT_TOKENS, "output_tps",
                *(name for name, metric in METRICS.items() if metric.kind is not None))
TURN_TABLE_COLUMNS = ("topology", "level", "turn", "requests", "failed", "input_tokens",
                      *(slo.percentile_column(kind, q) for kind in ("ttft", "itl")
                        for q in (0.5, slo.TAIL_QUANTILE)))
SUMMARY_TABLE_COLUMNS = (
    "topology", "level", "gpus", "requests", "failed", "output_tps", "output_tps_per_gpu",
    slo.GOODPUT_REQUESTS, per_gpu(slo.GOODPUT_REQUESTS), slo.GOODPUT_TOKENS, "attainment",
    *(slo.percentile_column(kind, slo.TAIL_QUANTILE) for kind in slo.SLO_KINDS),
    "input_tokens_planned", "input_tokens_counted", "top_error",
)


@dataclass(frozen=True)
class ResultsView:
    source: str  # "live" or the run folder's name
    out_dir: Path | None
    axis: str  # the load axis' name (Mode.axis): "concurrency" or "rate"
    summary: pd.DataFrame
    crossover: CrossoverReport
    requests: Callable[[], pd.DataFrame] = field(repr=False, default=pd.DataFrame)
    server: Callable[[], pd.DataFrame] = field(repr=False, default=pd.DataFrame)  # server_table's rows
    key: str = ""  # changes whenever the data does: charts are rebuilt only then

    @property
    def empty(self) -> bool:
        return self.summary is None or self.summary.empty


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def crossover_marks(crossover: CrossoverReport) -> list[CrossoverMark]:
    """Every actual crossing in the crossover report, as chart markers."""
    marks = []
    for item in crossover.crossovers:
        at = _finite(item.x)
        if item.kind != "crossing" or at is None:
            continue
        marks.append(CrossoverMark(metric=item.metric, at=at, low=_finite(item.ci_low),
                                   high=_finite(item.ci_high), sentence=item.sentence))
    return marks


def pareto(results: ResultsView) -> ParetoView:
    """The run's Pareto view, with the SLOs and objective its crossover report was made with."""
    return pareto_view(results.summary, results.axis, results.crossover.slos_ms, results.crossover.objective)


def _rank(item: Crossover) -> int:
    return METRIC_ORDER.index(item.metric) if item.metric in METRIC_ORDER else len(METRIC_ORDER)


def crossing_sentences(crossover: CrossoverReport) -> list[str]:
    """Sentences of actual crossings, goodput first."""
    items = [c for c in crossover.crossovers if c.kind == "crossing"]
    return [c.sentence for c in sorted(items, key=_rank) if c.sentence]


def headline_sentences(crossover: CrossoverReport, metric: str = slo.GOODPUT_REQUESTS) -> list[str]:
    """The crossover the page leads with: per pair, the goodput crossing the bootstrap supports most
    (the later one on a tie, since it decides who wins under more load)."""
    best: dict[tuple[str, str], tuple[float, float, str]] = {}
    for item in crossover.crossovers:
        at = _finite(item.x)
        if item.kind != "crossing" or item.metric != metric or at is None:
            continue
        pair = (item.topology_a, item.topology_b)
        candidate = (_finite(item.support) or 0.0, at, item.sentence)
        if pair not in best or candidate[:2] > best[pair][:2]:
            best[pair] = candidate
    return [best[pair][2] for pair in sorted(best)]


def other_sentences(crossover: CrossoverReport) -> list[str]:
    """Pairs that do not cross (or lack data) and each topology's capacity at the objective."""
    items = [c for c in crossover.crossovers if c.kind != "crossing"]
    lines = [c.sentence for c in sorted(items, key=_rank) if c.sentence]
    return lines + [c.sentence for c in crossover.capacities if c.sentence]


def failure_warnings(summary: pd.DataFrame) -> list[str]:
    """One line per (topology, level) where requests failed, with the commonest error."""
    if summary is None or summary.empty or "failed" not in summary.columns:
        return []
    lines = []
    for row in summary[summary["failed"] > 0].to_dict("records"):
        error = row.get("top_error") or "unknown error"
        lines.append(f"{row['topology']} at {float(row['level']):g}: {int(row['failed'])} of "
                     f"{int(row['requests'])} requests failed ({error})")
    return lines


def turns_table(results: ResultsView) -> pd.DataFrame:
    """TTFT and ITL per turn of a multi-turn sweep (empty for single-turn ones)."""
    if results.empty:
        return pd.DataFrame()
    table = turn_summary(results.requests())
    return table[[c for c in TURN_TABLE_COLUMNS if c in table.columns]] if not table.empty else table


def server_table(results: ResultsView) -> pd.DataFrame:
    """The servers' own figures per level of a run (kept beside each level's requests)."""
    return pd.DataFrame() if results.empty else results.server()


def _live_server_views(status: RunStatus) -> pd.DataFrame:
    if status.out_dir is None or not status.request_frames:
        return pd.DataFrame()
    try:
        plan = read_info(status.out_dir).plan
    except UserError:
        return pd.DataFrame()  # the sweep's own error says why
    return read_server_views(status.out_dir, plan, status.requests())


def summary_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The columns worth reading, in a stable order (the full table is in the downloads)."""
    if summary is None or summary.empty:
        return pd.DataFrame(columns=list(SUMMARY_TABLE_COLUMNS))
    return summary[[c for c in SUMMARY_TABLE_COLUMNS if c in summary.columns]]


def live_view(status: RunStatus) -> ResultsView:
    summary = status.summary if status.summary is not None else pd.DataFrame()
    return ResultsView(source="live", out_dir=status.out_dir, axis=status.axis, summary=summary,
                       crossover=status.crossover, requests=status.requests,
                       server=functools.partial(_live_server_views, status),
                       key=f"live:{status.out_dir}:{status.generation}")


def past_view(run: Run) -> ResultsView:
    requests, server = run.requests, run.server
    return ResultsView(source=run.out_dir.name, out_dir=run.out_dir, axis=run.info.plan.axis,
                       summary=run.summary, crossover=run.crossover, requests=lambda: requests,
                       server=lambda: server,
                       key=f"past:{run.out_dir}:{len(requests)}:{len(run.summary)}")
