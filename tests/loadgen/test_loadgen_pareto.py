"""The Pareto view (loadgen.analysis.pareto): points, front, knees and crossings of a summary table,
its chart, and `crossover analyze --plot` writing it."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from crossover import slo
from crossover.app.charts import pareto_chart
from crossover.loadgen.analysis.pareto import TPOT_COLUMN, pareto_view

# Two topologies over concurrency 1-8: "big" is faster per user, "small" gives more tokens per GPU
# under load, so the curves cross; big gains 5% from 4 to 8 while users slow down (its knee: 4).
ROWS = [  # topology, level, output tokens/s per GPU, median TPOT ms, attainment
    ("big", 1, 100.0, 10.0, 1.0), ("big", 2, 180.0, 11.0, 1.0), ("big", 4, 300.0, 13.0, 1.0),
    ("big", 8, 315.0, 25.0, 0.5),
    ("small", 1, 60.0, 20.0, 1.0), ("small", 2, 115.0, 21.0, 1.0), ("small", 4, 220.0, 23.0, 1.0),
    ("small", 8, 420.0, 24.5, 1.0),
]


def summary() -> pd.DataFrame:
    return pd.DataFrame([{"topology": t, "level": float(c), "output_tps_per_gpu": x, TPOT_COLUMN: tpot,
                          slo.attainment_column(): a} for t, c, x, tpot, a in ROWS])


def test_points_front_knee_and_crossing() -> None:
    view = pareto_view(summary(), "concurrency", {"ttft": 500.0, "tpot": 24.0}, 0.99)
    by = {(p.topology, p.level): p for p in view.points}
    assert by[("big", 1.0)].interactivity == pytest.approx(100.0)  # 1 / 10 ms
    assert view.interactivity_floor == pytest.approx(1000 / 24)
    assert [(p.topology, p.level) for p in view.points if p.knee] == [("big", 4.0)]
    assert not by[("big", 8.0)].meets_objective and by[("small", 8.0)].meets_objective
    # small at 8 (420) beats big at 8 (315) on both axes; big at 1 is the fastest per user
    assert not by[("big", 8.0)].on_front and by[("small", 8.0)].on_front and by[("big", 1.0)].on_front
    (crossing,) = view.crossings
    # over 40.8-50 tokens/s per user, both span: small leads at 40.8 (420 to 315), big at 50
    assert crossing.above == "big" and crossing.below == "small"
    assert 1000 / 24.5 < crossing.interactivity < 50.0
    assert math.isfinite(crossing.throughput_per_gpu)
    assert any("knee" in s for s in view.sentences) and crossing.sentence in view.sentences


def test_levels_without_a_tpot_are_left_out_and_empty_tables_give_no_points() -> None:
    table = summary()
    table.loc[0, TPOT_COLUMN] = float("nan")
    view = pareto_view(table, "concurrency", {"ttft": 500.0}, 0.99)
    assert len(view.points) == len(ROWS) - 1 and view.interactivity_floor is None
    assert pareto_view(pd.DataFrame(), "rate", {}, 0.99).points == ()


def test_chart_draws_the_floor_front_knee_and_crossing() -> None:
    view = pareto_view(summary(), "concurrency", {"tpot": 24.0}, 0.99)
    spec = pareto_chart(view).to_dict(validate=False)
    marks = [layer["mark"]["type"] if isinstance(layer["mark"], dict) else layer["mark"]
             for layer in spec["layer"]]
    assert marks[:2] == ["rect", "rule"]  # the TPOT floor: band and its edge
    assert "line" in marks and marks.count("point") == 3  # points, the front's rings, the knee
    assert marks[-1] == "rule"  # the crossing
    assert "per user" in spec["layer"][2]["encoding"]["x"]["title"]
