"""The page through Streamlit's AppTest: widgets, the sweep's state transitions and every error
shown as st.error, against a real simulated fleet where traffic is needed."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from crossover.app.runner import RunState, RunStatus, SweepRunner
from crossover.app.runs import list_runs
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import free_port
from crossover.sim.fleet import running_fleet
from tests.app.app_fixtures import spec_file_on_free_ports

PAGE = str(Path(__file__).resolve().parents[2] / "app" / "page.py")


def open_page(monkeypatch, *args: str) -> AppTest:
    monkeypatch.setattr(sys, "argv", ["page.py", *args])
    app = AppTest.from_file(PAGE, default_timeout=30)
    app.run()
    return app


def progress_text(app: AppTest) -> str:
    bars = app.get("progress")
    return bars[0].proto.text if bars else ""


def texts(app: AppTest) -> str:
    parts = [e.value for kind in ("error", "warning", "success", "info") for e in getattr(app, kind)]
    return "\n".join(map(str, parts))


def small_plan(app: AppTest, levels: str = "1,4", requests: int = 4, output: str = "8") -> None:
    app.text_input(key="levels").set_value(levels)
    app.number_input(key="requests_per_level").set_value(requests)
    app.text_input(key="output_len").set_value(output)
    app.text_input(key="input_len").set_value("64")
    app.number_input(key="bootstrap").set_value(30)  # the interval is not under test here: keep levels quick


PARETO_TITLE = "Throughput per GPU against interactivity"


def load_chart_titles(app: AppTest) -> list[str]:
    """The titles of the charts against load, after checking the one Pareto chart is drawn."""
    titles = chart_titles(app)
    pareto = [t for t in titles if t.startswith(PARETO_TITLE)]
    assert len(pareto) == 1, titles
    return [t for t in titles if t not in pareto]


def chart_titles(app: AppTest) -> list[str]:
    """The titles of the charts drawn, from their Vega-Lite specs."""
    titles = []
    for chart in app.get("vega_lite_chart"):
        title = json.loads(chart.proto.spec).get("title")
        titles.append(title.get("text", "") if isinstance(title, dict) else str(title))
    return titles


def steps_done(app: AppTest) -> int:
    found = re.search(r"(\d+) of \d+ \(topology, level\) steps", progress_text(app))
    return int(found.group(1)) if found else 0


def assert_buttons_agree_with_progress(app: AppTest) -> None:
    """What a user sees on one page: Start and Stop enabled as the progress bar's state says."""
    running = progress_text(app).startswith(("Sweep running", "Stopping"))
    assert app.button(key="start").proto.disabled is running, progress_text(app)
    assert app.button(key="stop").proto.disabled is not running, progress_text(app)


# Only a hang detector: every sweep under test is bounded by its request count, and a loaded 2-core
# machine can take several times longer than a quiet one.
HANG_S = 300.0


def run_until(app: AppTest, done, timeout: float = HANG_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        app.run()
        if done(app):
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out; page says: {progress_text(app)!r} {texts(app)!r}")


def test_the_page_starts_prefilled_from_the_spec(monkeypatch, tmp_path):
    _, path = spec_file_on_free_ports(tmp_path)
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"))
    assert not app.exception and not app.error
    assert app.title[0].value == "vllm-crossover: meta-llama/Llama-3.1-70B-Instruct on H100-SXM-80GB"
    assert app.multiselect(key="topologies").value == ["tp4x1", "tp2x2"]
    assert app.number_input(key="slo_ttft").value == 2500.0
    assert app.number_input(key="slo_tpot").value == 50.0
    assert app.number_input(key="slo_itl").value == 0.0
    assert app.button(key="start").proto.disabled is False
    assert app.button(key="stop").proto.disabled is True
    assert "press Start sweep" in app.info[0].value


@pytest.mark.parametrize(("args", "message"), [
    (["missing.yaml"], "missing.yaml: no such file"),
    (["SPEC", "--exporter", "ftp://x"], "--exporter: malformed URL"),
    ([], "app arguments: the following arguments are required: spec"),
])
def test_bad_arguments_are_an_error_on_the_page(monkeypatch, tmp_path, args, message):
    _, path = spec_file_on_free_ports(tmp_path)
    args = [str(path) if a == "SPEC" else a for a in args]
    app = open_page(monkeypatch, *args)
    assert not app.exception
    assert message in app.error[0].value


def test_a_broken_spec_is_an_error_on_the_page(monkeypatch, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("model: {name: x}\n")
    app = open_page(monkeypatch, str(path))
    assert not app.exception
    assert app.error[0].value.startswith(f"{path}: ")


def test_an_exporter_that_is_down_is_a_warning_not_a_crash(monkeypatch, tmp_path):
    _, path = spec_file_on_free_ports(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"), "--exporter", url)
    run_until(app, lambda a: bool(a.warning))
    assert not app.exception and not app.error
    assert any(s.value == "What the servers saw (exporter)" for s in app.subheader)
    assert app.warning[0].value.startswith(f"exporter at {url}: ")
    assert "cannot connect" in app.warning[0].value


def test_invalid_slos_are_refused_before_any_traffic(monkeypatch, tmp_path):
    _, path = spec_file_on_free_ports(tmp_path)
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"))
    app.number_input(key="slo_ttft").set_value(0.0)
    app.number_input(key="slo_tpot").set_value(0.0)
    app.button(key="start").click().run()
    assert not app.exception
    assert "SLO invalid" in app.error[0].value
    assert app.button(key="start").proto.disabled is False
    assert list_runs(tmp_path / "results") == []


def test_a_target_that_is_down_is_named(monkeypatch, tmp_path):
    spec, path = spec_file_on_free_ports(tmp_path)  # nothing listens on these ports
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"))
    app.button(key="start").click().run()
    assert not app.exception
    error = app.error[0].value
    url = spec.topologies[0].instances[0].url
    assert f"target down: tp4x1 at {url}" in error and "Start the fleet" in error


@pytest.mark.slow
def test_a_sweep_runs_in_the_background_and_the_page_follows_it(monkeypatch, tmp_path):
    spec, path = spec_file_on_free_ports(tmp_path)
    results = tmp_path / "results"
    with running_fleet(spec):
        app = open_page(monkeypatch, str(path), "--results", str(results))
        small_plan(app, levels="1,2,4")
        app.button(key="start").click().run()
        # the page came back while the sweep runs: pressing Start does not wait for it
        assert not app.exception and not app.error
        assert progress_text(app).startswith("Sweep running")
        assert_buttons_agree_with_progress(app)
        rows_seen: list[int] = []

        def finished(page: AppTest) -> bool:
            assert_buttons_agree_with_progress(page)
            if page.dataframe:
                rows_seen.append(len(page.dataframe[0].value))
            return progress_text(page).startswith("Sweep finished")

        run_until(app, finished)
    # the table grew level by level while the sweep ran, never shrinking
    assert rows_seen == sorted(rows_seen) and rows_seen[-1] == 6
    assert len(set(rows_seen)) >= 3, rows_seen
    assert not app.exception and not app.error
    assert "6 of 6" in progress_text(app)
    assert app.button(key="start").proto.disabled is False
    table = app.dataframe[0].value
    assert sorted(set(table["topology"])) == ["tp2x2", "tp4x1"] and len(table) == 6
    assert (table["requests"] > 0).all()
    # a crossing or the statement that there is none, for every pair and metric
    assert app.success or app.info
    labels = [b.proto.label for b in app.get("download_button")]
    assert {"requests.csv", "requests.parquet", "summary.json", "crossover.json"} <= set(labels)
    assert [r.name for r in list_runs(results)] == [p.name for p in results.iterdir()]
    # the Per GPU toggle redraws the rates per GPU and leaves the latencies alone
    # one Pareto chart (always per GPU) beside the six charts against load
    titles = load_chart_titles(app)
    assert len(titles) == 6 and not any("per GPU" in t for t in titles), titles
    app.toggle(key="per_gpu").set_value(True).run()
    assert not app.exception and not app.error
    per_gpu = load_chart_titles(app)
    rates = [t for t in titles if "/s" in t]
    assert len(rates) == 3, titles
    assert sorted(per_gpu) == sorted(t[:-1] + " per GPU)" if t in rates else t for t in titles), per_gpu


@pytest.mark.slow
def test_a_sweep_that_fails_says_why_on_the_page(monkeypatch, tmp_path):
    spec, path = spec_file_on_free_ports(tmp_path)
    results = tmp_path / "results"
    results.write_text("a file where the results folder should be")
    with running_fleet(spec):
        app = open_page(monkeypatch, str(path), "--results", str(results))
        small_plan(app, levels="1")
        app.button(key="start").click().run()
        run_until(app, lambda a: progress_text(a).startswith("Sweep failed"))
    assert not app.exception
    assert "cannot create the folder" in app.error[0].value
    assert app.button(key="start").proto.disabled is False


@pytest.mark.slow
def test_stop_ends_the_sweep_and_a_past_run_can_be_opened(monkeypatch, tmp_path):
    spec, path = spec_file_on_free_ports(tmp_path)
    results = tmp_path / "results"
    with running_fleet(spec):
        app = open_page(monkeypatch, str(path), "--results", str(results))
        small_plan(app, levels="1,2,4,8,16,32", requests=8, output="16")
        app.button(key="start").click().run()
        run_until(app, lambda a: steps_done(a) >= 2)
        app.button(key="stop").click().run()
        run_until(app, lambda a: progress_text(a).startswith("Sweep stopped"))
    assert not app.exception and not app.error
    measured = len(app.dataframe[0].value)
    assert 2 <= measured < 12
    # a fresh session opens the stopped run from the results folder
    other = open_page(monkeypatch, str(path), "--results", str(results))
    past = list_runs(results)
    assert len(past) == 1
    assert other.selectbox(key="past_run").value == str(past[0].path)
    other.button(key="open_run").click().run()
    assert not other.exception and not other.error
    assert any(past[0].name in c.value for c in other.caption)
    assert len(other.dataframe[0].value) == measured


@pytest.mark.slow
def test_follow_shows_a_sweep_another_process_writes_level_by_level(monkeypatch, tmp_path):
    """`crossover demo` runs its sweep beside the app and starts it with --follow: the page opens on
    that folder, waits for it, and redraws it as each level lands, then stops polling."""
    spec, path = spec_file_on_free_ports(tmp_path)
    results, run_dir = tmp_path / "results", tmp_path / "results" / "sweep"
    plan = SweepPlan(levels=(1, 2, 4), requests_per_level=4, input_len=LengthDist.fixed(64),
                     output_len=LengthDist.fixed(8))
    with running_fleet(spec):
        app = open_page(monkeypatch, str(path), "--results", str(results), "--follow", str(run_dir))
        assert not app.exception and not app.error
        assert "Waiting for the sweep" in texts(app)
        writer = threading.Thread(target=run_sweep, args=(spec, plan, run_dir), kwargs={"n_boot": 30})
        writer.start()
        rows_seen: list[int] = []

        def complete(page: AppTest) -> bool:
            rows_seen.append(len(page.dataframe[0].value) if page.dataframe else 0)
            return rows_seen[-1] == 6

        try:
            run_until(app, complete)
        finally:
            writer.join(60)
    assert not app.exception and not app.error
    assert len(set(rows_seen) - {0}) >= 2, rows_seen  # seen part-way, not only once finished
    assert rows_seen == sorted(rows_seen)
    assert any(run_dir.name in c.value for c in app.caption)
    assert app.success or app.info  # the crossover sentence, or the statement that there is none


@pytest.mark.slow
def test_a_folder_of_vllm_bench_results_opens_as_a_past_run(monkeypatch, tmp_path):
    """vllm bench serve --save-result --save-detailed files (here written by a sweep with
    --save-result, as vllm bench writes them) in the results folder open like a sweep."""
    import shutil

    from crossover.loadgen.analysis.benchjson import BenchOptions

    spec, path = spec_file_on_free_ports(tmp_path)
    plan = SweepPlan(levels=(1, 4), requests_per_level=6, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(8))
    with running_fleet(spec):
        run_sweep(spec, plan, tmp_path / "sweep", n_boot=0, bench=BenchOptions(detailed=True))
    bench = tmp_path / "results" / "bench"
    bench.mkdir(parents=True)
    for result in (tmp_path / "sweep" / "levels").glob("*/c*.json"):
        if not result.name.endswith(".server.json"):
            shutil.copy(result, bench / f"{result.parent.name}-{result.name}")
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"))
    past = list_runs(tmp_path / "results")
    assert [p.path for p in past] == [bench] and "vllm bench" in past[0].name
    app.button(key="open_run").click().run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    assert len(app.dataframe[0].value) == 2 * len(spec.topologies)
    assert any(s.value == "Throughput per GPU against interactivity" for s in app.subheader)


def test_a_sweep_that_ends_while_the_page_is_drawn_shows_one_state(monkeypatch, tmp_path):
    """The runner's state changes between two reads of one page run: the page shows one of them."""
    _, path = spec_file_on_free_ports(tmp_path)
    first = iter([RunStatus(state=RunState.RUNNING, levels_total=2)])
    finished = RunStatus(state=RunState.FINISHED, levels_done=2, levels_total=2)
    monkeypatch.setattr(SweepRunner, "status", lambda self: next(first, finished))
    app = open_page(monkeypatch, str(path), "--results", str(tmp_path / "results"))
    assert not app.exception
    assert progress_text(app).startswith("Sweep finished")
    assert_buttons_agree_with_progress(app)
