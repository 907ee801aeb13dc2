from __future__ import annotations

from typing import Any

import pandas as pd

from crossover import slo
from crossover.app import charts, view
from crossover.loadgen.analysis.report import CrossoverReport
from tests.app.app_fixtures import seed_summary

CROSSOVER: dict[str, Any] = {
    "crossovers": [
        {"metric": "ttft_p99", "kind": "crossing", "x": 3.0, "ci_low": 2.0, "ci_high": 5.0,
         "sentence": "tp2x2 overtakes tp4x1 in p99 TTFT at concurrency about 3 (95% CI 2-5)"},
        {"metric": slo.GOODPUT_REQUESTS, "kind": "crossing", "x": 11.2, "ci_low": 8.1, "ci_high": 14.3,
         "topology_a": "tp2x2", "topology_b": "tp4x1", "support": 0.9,
         "sentence": "tp2x2 overtakes tp4x1 in goodput at concurrency about 11 (95% CI 8-14)"},
        {"metric": slo.GOODPUT_REQUESTS, "kind": "crossing", "x": 1.1, "ci_low": 1.0, "ci_high": 1.3,
         "topology_a": "tp2x2", "topology_b": "tp4x1", "support": 0.4,
         "sentence": "tp4x1 overtakes tp2x2 in goodput at concurrency about 1.1 (95% CI 1-1.3)"},
        {"metric": "itl_p99", "kind": "none", "x": None, "ci_low": None, "ci_high": None,
         "sentence": "tp4x1 stays ahead of tp2x2 in p99 ITL over concurrency 1-128 (no crossing in range)"},
    ],
    "capacities": [{"sentence": "tp4x1 meets the 99% SLO objective up to concurrency about 40"}],
}
REPORT = CrossoverReport.from_json(CROSSOVER)  # a partial crossover.json: what it lacks, defaults


def metric(key: str) -> charts.ChartMetric:
    return next(m for m in charts.CHART_METRICS if m.key == key)


def test_chart_frame_has_one_row_per_topology_and_level():
    frame = charts.chart_frame(seed_summary(), metric("output_tps"), {}, per_gpu=False)
    assert list(frame.columns) == ["topology", "level", "value"]
    assert len(frame) == 12
    row = frame[(frame["topology"] == "tp2x2") & (frame["level"] == 128)]
    assert row["value"].item() == 5800


def test_per_gpu_divides_rates_by_the_spec_gpus_but_never_latencies():
    summary = seed_summary()
    gpus = {"tp4x1": 4, "tp2x2": 2}  # as if tp2x2 were one replica smaller
    tps = charts.chart_frame(summary, metric("output_tps"), gpus, per_gpu=True)
    tps = tps.set_index(["topology", "level"])
    assert tps.loc[("tp4x1", 128.0), "value"] == 2900 / 4
    assert tps.loc[("tp2x2", 128.0), "value"] == 5800 / 2
    ttft = charts.chart_frame(summary, metric("ttft_p99_ms"), gpus, per_gpu=True)
    assert ttft["value"].max() == 50.0 * 128


def test_chart_frame_of_an_empty_or_partial_summary_is_empty_not_an_error():
    assert charts.chart_frame(pd.DataFrame(), metric(slo.GOODPUT_REQUESTS), {}, False).empty
    partial = seed_summary().drop(columns=["itl_p99_ms"])
    assert charts.chart_frame(partial, metric("itl_p99_ms"), {}, False).empty
    nan_row = seed_summary()
    nan_row.loc[0, slo.GOODPUT_REQUESTS] = float("nan")
    assert len(charts.chart_frame(nan_row, metric(slo.GOODPUT_REQUESTS), {}, False)) == 11


def _layers(chart) -> list[dict]:
    return chart.to_dict()["layer"]


def test_the_crossover_is_a_rule_and_a_band_on_its_own_metric_only():
    marks = view.crossover_marks(REPORT)
    # "none" is no marker
    assert [m.metric for m in marks] == ["ttft_p99", slo.GOODPUT_REQUESTS, slo.GOODPUT_REQUESTS]
    goodput = metric(slo.GOODPUT_REQUESTS)
    frame = charts.chart_frame(seed_summary(), goodput, {}, False)
    spec = charts.metric_chart(frame, goodput, "concurrency", False, marks).to_dict()
    kinds = [layer["mark"]["type"] for layer in spec["layer"]]
    assert kinds == ["rect", "line", "point", "rule"]
    datasets = spec["datasets"]
    rule_data = next(v for v in datasets.values() if v and "at" in v[0])
    band_data = next(v for v in datasets.values() if v and "low" in v[0])
    assert rule_data == [{"at": 11.2, "sentence": CROSSOVER["crossovers"][1]["sentence"]},
                         {"at": 1.1, "sentence": CROSSOVER["crossovers"][2]["sentence"]}]
    assert band_data == [{"low": 8.1, "high": 14.3}, {"low": 1.0, "high": 1.3}]
    assert spec["layer"][1]["encoding"]["x"]["scale"]["type"] == "log"  # 1..128 spans 7 octaves
    tps = metric("output_tps")
    tps_frame = charts.chart_frame(seed_summary(), tps, {}, False)
    plain = charts.metric_chart(tps_frame, tps, "concurrency", False, marks)
    assert len(_layers(plain)) == 2


def test_chart_titles_say_per_gpu_only_for_rates():
    goodput, ttft = metric(slo.GOODPUT_REQUESTS), metric("ttft_p99_ms")
    empty = charts.chart_frame(pd.DataFrame(), goodput, {}, True)
    assert charts.metric_chart(empty, goodput, "rate", True).to_dict()["title"] == \
        "Goodput (requests/s within SLO) (req/s per GPU)"
    ttft_spec = charts.metric_chart(empty, ttft, "rate", True).to_dict()
    assert ttft_spec["title"] == "TTFT p99 (ms)"
    assert ttft_spec["layer"][0]["encoding"]["x"]["title"] == "request rate (req/s)"


def test_the_headline_is_the_best_supported_goodput_crossing_of_each_pair():
    assert view.headline_sentences(REPORT) == [CROSSOVER["crossovers"][1]["sentence"]]
    tie = CrossoverReport.from_json({"crossovers": [dict(c, support=0.5) for c in CROSSOVER["crossovers"]]})
    assert view.headline_sentences(tie) == [CROSSOVER["crossovers"][1]["sentence"]]  # the later one
    only_ttft = CrossoverReport.from_json({"crossovers": [CROSSOVER["crossovers"][0]]})
    assert view.headline_sentences(only_ttft) == []


def test_sentences_put_goodput_first_and_keep_the_rest_apart():
    crossings = CROSSOVER["crossovers"]
    assert view.crossing_sentences(REPORT) == [crossings[1]["sentence"], crossings[2]["sentence"],
                                               crossings[0]["sentence"]]
    others = view.other_sentences(REPORT)
    assert others[0].startswith("tp4x1 stays ahead") and others[1].startswith("tp4x1 meets")
    nothing = CrossoverReport()
    assert view.crossing_sentences(nothing) == [] and view.crossover_marks(nothing) == []


def test_failures_become_one_warning_per_level():
    summary = seed_summary()
    summary.loc[3, "failed"] = 5
    summary.loc[3, "top_error"] = "HTTP 503"
    assert view.failure_warnings(summary) == ["tp4x1 at 32: 5 of 64 requests failed (HTTP 503)"]


def test_server_chart_marks_levels_on_the_time_axis():
    frame = pd.DataFrame({"time": pd.to_datetime([1, 2, 3], unit="s"), "topology": ["a", "a", "b"],
                          "ttft_p99_ms": [1.0, 2.0, 3.0]})
    marks = pd.DataFrame({"time": pd.to_datetime([2], unit="s"), "label": ["a at 1"]})
    spec = charts.server_chart(frame, "ttft_p99_ms", "TTFT p99", "ms", marks).to_dict()
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["line", "rule"]


def test_a_runs_pareto_view_takes_the_reports_slos_and_draws_every_level():
    report = CrossoverReport.from_json({**CROSSOVER, "slos_ms": {"tpot": 25.0}, "objective": 0.99})
    results = view.ResultsView(source="run", out_dir=None, axis="concurrency", summary=seed_summary(),
                               crossover=report)
    found = view.pareto(results)
    assert len(found.points) == 12 and found.interactivity_floor == 40.0
    # the same TPOT per level for both: tp4x1 gives more per GPU at concurrency 1 (fastest per user)
    # and 4, tp2x2 from 16 on, so their curves cross between the interactivities of 4 and 16
    (crossing,) = found.crossings
    assert (crossing.above, crossing.below) == ("tp4x1", "tp2x2")
    assert slo.interactivity(0.017) < crossing.interactivity < slo.interactivity(0.0155)
    assert {p.topology for p in found.points if p.on_front} == {"tp4x1", "tp2x2"}
    spec = charts.pareto_chart(found).to_dict(validate=False)
    assert spec["layer"][0]["mark"]["type"] == "rect"  # the TPOT floor is drawn
