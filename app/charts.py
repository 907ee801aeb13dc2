"""Altair charts from plain DataFrames: one line per topology against load, the crossover marked.

Everything here is pure: a summary table in, a chart object out, so tests can build the charts
from a table they write by hand and inspect the Vega-Lite spec without a browser.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import altair as alt
import pandas as pd

from crossover import slo
from crossover.loadgen.analysis.pareto import ParetoView


@dataclass(frozen=True)
class ChartMetric:
    key: str  # column of crossover.loadgen.analysis.summary's table
    title: str
    unit: str
    per_gpu: bool  # a rate that is meaningful divided by the topology's GPUs
    crossover_metric: str | None = None  # the crossover metric whose marker belongs on this chart


CHART_METRICS: tuple[ChartMetric, ...] = (
    ChartMetric("output_tps", "Output tokens/s", "tok/s", True, "output_tps"),
    ChartMetric(slo.GOODPUT_REQUESTS, "Goodput (requests/s within SLO)", "req/s", True, slo.GOODPUT_REQUESTS),
    ChartMetric(slo.GOODPUT_TOKENS, "Goodput (tokens/s within SLO)", "tok/s", True, slo.GOODPUT_TOKENS),
    *(ChartMetric(slo.percentile_column(kind, slo.TAIL_QUANTILE),
                  f"{kind.upper()} {slo.percentile_label(slo.TAIL_QUANTILE)}", "ms", False)
      for kind in slo.TAIL_KINDS),
)


AXIS_TITLES = {"concurrency": "concurrency (requests in flight)", "rate": "request rate (req/s)"}


@dataclass(frozen=True)
class CrossoverMark:
    """Where one topology overtakes another, with its confidence band, in the load axis' units."""

    metric: str
    at: float
    low: float | None
    high: float | None
    sentence: str


def chart_frame(summary: pd.DataFrame, metric: ChartMetric, gpus: dict[str, int],
                per_gpu: bool) -> pd.DataFrame:
    """Long table (topology, level, value) for one metric, divided by GPUs when asked and sensible."""
    if summary.empty or metric.key not in summary.columns:
        return pd.DataFrame({"topology": pd.Series(dtype=str), "level": pd.Series(dtype=float),
                             "value": pd.Series(dtype=float)})
    frame = summary[["topology", "level", metric.key]].rename(columns={metric.key: "value"}).copy()
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    if per_gpu and metric.per_gpu:
        # the spec's GPUs first (what the user is comparing), the run's own record otherwise
        recorded = summary["gpus"] if "gpus" in summary.columns else pd.Series(1, index=summary.index)
        divisor = [gpus.get(str(name)) or int(n or 1) for name, n in zip(frame["topology"], recorded,
                                                                          strict=True)]
        frame["value"] = frame["value"] / pd.Series(divisor, index=frame.index, dtype=float)
    frame = frame.dropna(subset=["value"])
    frame = frame[frame["value"].map(math.isfinite)]
    return frame.sort_values(["topology", "level"]).reset_index(drop=True)


def _x_scale(levels: pd.Series) -> alt.Scale:
    positive = levels[levels > 0]
    if len(positive) and positive.min() > 0 and positive.max() / positive.min() >= 8:
        return alt.Scale(type="log", base=2)
    return alt.Scale(zero=False)


def metric_chart(frame: pd.DataFrame, metric: ChartMetric, axis: str, per_gpu: bool,
                 crossovers: list[CrossoverMark] | None = None, height: int = 260) -> alt.TopLevelMixin:
    """One line per topology against load; a dashed rule and a shaded band at each crossover."""
    unit = f"{metric.unit} per GPU" if per_gpu and metric.per_gpu else metric.unit
    title = f"{metric.title} ({unit})"
    axis_title = AXIS_TITLES.get(axis, axis)
    x = alt.X("level:Q", title=axis_title, scale=_x_scale(frame["level"]) if len(frame) else alt.Undefined)
    base = alt.Chart(frame).encode(
        x=x,
        y=alt.Y("value:Q", title=unit),
        color=alt.Color("topology:N", title="topology"),
        tooltip=[alt.Tooltip("topology:N"), alt.Tooltip("level:Q", title=axis_title),
                 alt.Tooltip("value:Q", title=unit, format=",.4~g")],
    )
    layers: list[alt.Chart] = [base.mark_line(), base.mark_point(filled=True, size=45)]
    marks = [c for c in (crossovers or []) if c.metric == metric.crossover_metric]
    if marks:
        bands = pd.DataFrame([{"low": c.low, "high": c.high} for c in marks
                              if c.low is not None and c.high is not None])
        if len(bands):
            layers.insert(0, alt.Chart(bands).mark_rect(opacity=0.15, color="#888").encode(
                x="low:Q", x2="high:Q"))
        rules = pd.DataFrame([{"at": c.at, "sentence": c.sentence} for c in marks])
        layers.append(alt.Chart(rules).mark_rule(strokeDash=[6, 4], color="#444").encode(
            x="at:Q", tooltip=alt.Tooltip("sentence:N", title="crossover")))
    return alt.layer(*layers).properties(title=title, height=height)


def server_chart(frame: pd.DataFrame, value: str, title: str, unit: str,
                 level_marks: pd.DataFrame | None = None, height: int = 220) -> alt.TopLevelMixin:
    """A server-side series over time (columns time, topology, VALUE), with the sweep's levels as rules."""
    base = alt.Chart(frame).encode(
        x=alt.X("time:T", title="time"),
        y=alt.Y(f"{value}:Q", title=unit),
        color=alt.Color("topology:N", title="topology"),
        tooltip=[alt.Tooltip("time:T", format="%H:%M:%S"), alt.Tooltip("topology:N"),
                 alt.Tooltip(f"{value}:Q", format=",.4~g")],
    )
    layers: list[alt.Chart] = [base.mark_line(point=True)]
    if level_marks is not None and len(level_marks):
        layers.append(alt.Chart(level_marks).mark_rule(color="#999", strokeDash=[2, 3]).encode(
            x="time:T", tooltip=[alt.Tooltip("label:N", title="level done")]))
    return alt.layer(*layers).properties(title=f"{title} ({unit})", height=height)


PARETO_X = "interactivity (output tokens/s per user, 1 / median TPOT)"
PARETO_Y = "output tokens/s per GPU"


def pareto_chart(pareto: ParetoView, height: int = 320) -> alt.TopLevelMixin:
    """Output tokens/s per GPU against interactivity: one curve per topology in rising load, the
    points that miss the objective hollow, the front ringed, each knee a cross, the TPOT SLO's
    floor a shaded band below it, and every crossing of two curves a dashed rule."""
    frame = pareto.frame()
    frame["status"] = frame["meets_objective"].map({True: "meets the objective", False: "misses it"})
    axis_title = AXIS_TITLES.get(pareto.axis, pareto.axis)
    x = alt.X("interactivity:Q", title=PARETO_X, scale=alt.Scale(zero=False))
    y = alt.Y("throughput_per_gpu:Q", title=PARETO_Y)
    tooltip = [alt.Tooltip("topology:N"), alt.Tooltip("level:Q", title=axis_title),
               alt.Tooltip("throughput_per_gpu:Q", title=PARETO_Y, format=",.4~g"),
               alt.Tooltip("interactivity:Q", title="tokens/s per user", format=",.4~g"),
               alt.Tooltip("status:N", title=f"objective {pareto.objective:g}")]
    color = alt.Color("topology:N", title="topology")
    base = alt.Chart(frame).encode(x=x, y=y, color=color, tooltip=tooltip)
    layers: list[alt.Chart] = []
    if pareto.interactivity_floor is not None and math.isfinite(pareto.interactivity_floor) and len(frame):
        left = min(float(frame["interactivity"].min()), pareto.interactivity_floor)
        band = pd.DataFrame([{"low": left, "high": pareto.interactivity_floor,
                              "label": f"TPOT SLO: below {pareto.interactivity_floor:,.4g} tokens/s "
                                       "per user"}])
        layers.append(alt.Chart(band).mark_rect(opacity=0.12, color="#c44").encode(
            x="low:Q", x2="high:Q", tooltip=alt.Tooltip("label:N", title="SLO")))
        layers.append(alt.Chart(band).mark_rule(color="#c44").encode(x="high:Q", tooltip="label:N"))
    layers += [
        base.mark_line().encode(order="level:Q"),
        base.mark_point(size=60, filled=False, fillOpacity=1, strokeWidth=1.5).encode(
            fill=alt.condition("datum.meets_objective", alt.Color("topology:N", legend=None),
                               alt.value("white"))),
    ]
    front = frame[frame["on_front"]]
    if len(front):
        layers.append(alt.Chart(front).mark_point(size=220, color="#222", strokeWidth=1).encode(
            x=x, y=y, tooltip=tooltip))
    knees = frame[frame["knee"]].assign(label="knee")
    if len(knees):
        layers.append(alt.Chart(knees).mark_point(shape="cross", size=260, filled=True, color="#222").encode(
            x=x, y=y, tooltip=[alt.Tooltip("label:N", title=""), *tooltip]))
    if pareto.crossings:
        rules = pd.DataFrame([{"at": c.interactivity, "sentence": c.sentence} for c in pareto.crossings])
        layers.append(alt.Chart(rules).mark_rule(strokeDash=[6, 4], color="#444").encode(
            x="at:Q", tooltip=alt.Tooltip("sentence:N", title="crossover")))
    title = ("Throughput per GPU against interactivity (front ringed, knee crossed, hollow: misses the "
             "objective)")
    return alt.layer(*layers).properties(title=title, height=height)
