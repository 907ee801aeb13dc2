"""The server-side view: rows from a real exporter's snapshot over the simulated fleet, the
Prometheus queries checked against the generated recording rules, and readable errors."""

from __future__ import annotations

import time
import urllib.parse
from typing import Any

import pytest

from crossover.app import serverview
from crossover.app.config import AppConfig
from crossover.app.runner import LevelMark
from crossover.exporter.service import Exporter, running_exporter
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import free_port, spec_on_free_ports
from crossover.rules.model import build_rules
from crossover.sim.fleet import running_fleet
from crossover.spec import load_spec
from tests.app.app_fixtures import SEED_SPEC, fast_scrape


def test_the_exporter_shows_what_the_servers_saw_during_traffic(tmp_path):
    spec = fast_scrape(spec_on_free_ports(load_spec(SEED_SPEC)))
    with running_fleet(spec), running_exporter(Exporter(spec)) as url:
        poller = serverview.ServerPoller("exporter", url, spec)
        poller.poll_once()
        assert poller.history().error is None
        plan = SweepPlan(levels=(4,), requests_per_level=24, input_len=LengthDist.fixed(64),
                         output_len=LengthDist.fixed(16))
        run_sweep(spec, plan, tmp_path / "run")
        time.sleep(1.5)  # one more scrape after the last request
        poller.poll_once()
        # a page opened after the sweep (nothing refreshes it) has the servers' figures at once
        late = serverview.ServerPoller("exporter", url, spec, interval_s=3600)
        late.start()
        try:
            assert set(late.history().frame["topology"]) == {"tp2x2", "tp4x1"}
        finally:
            late.stop()
    history = poller.history()
    assert history.error is None
    latest = history.frame.groupby("topology").last()
    assert sorted(latest.index) == ["tp2x2", "tp4x1"]
    assert (latest["output_tps"] > 0).all()
    assert (latest["tpot_p99_ms"] > 0).all() and (latest["ttft_p99_ms"] > 0).all()
    assert str(history.frame["time"].dtype).startswith("datetime64")


def test_an_exporter_that_is_down_is_one_readable_line():
    spec = load_spec(SEED_SPEC)
    url = f"http://127.0.0.1:{free_port()}"
    poller = serverview.ServerPoller("exporter", url, spec)
    poller.poll_once()
    history = poller.history()
    assert history.frame.empty
    assert history.error is not None and history.error.startswith(f"exporter at {url}: ")
    assert "cannot connect" in history.error and "\n" not in history.error


def test_prometheus_queries_name_recording_rules_that_the_rules_generator_writes():
    spec = load_spec(SEED_SPEC)
    names = build_rules(spec).record_names
    for key, query in serverview.prometheus_queries(spec).items():
        record = query.removeprefix("1000 * ")
        assert record in names, (key, record)


def test_prometheus_answers_become_rows_per_topology():
    def fetch(url: str) -> Any:
        assert url.startswith("http://prom:9090/api/v1/query?query=")
        return {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"topology": "tp4x1"}, "value": [1.0, "12.5"]},
            {"metric": {"topology": "tp2x2"}, "value": [1.0, "NaN"]},
            {"metric": {}, "value": [1.0, "3"]},
        ]}}

    queries = {"ttft_p99_ms": "q1", "output_tps": "q2"}
    rows = serverview.prometheus_rows("http://prom:9090", queries, 7.0, fetch)
    assert rows == [{"time": 7.0, "topology": "tp4x1", "ttft_p99_ms": 12.5, "output_tps": 12.5}]
    with pytest.raises(ValueError, match="failed: bad_data: parse error"):
        serverview.prometheus_rows("http://prom:9090", {"x": "rate("}, 7.0,
                                   lambda url: {"status": "error", "error": "bad_data: parse error"})


def test_decode_side_topologies_are_named_from_either_source():
    snapshot = {"topologies": [{"name": "colocated", "requests_source": "instances", "ttft_p99_ms": 1.0},
                               {"name": "pd1p1d", "requests_source": "decode", "ttft_p99_ms": 2.0}]}
    frame = serverview.history_frame(serverview.exporter_rows(snapshot, 1.0))
    assert serverview.decode_side(frame) == ["pd1p1d"]

    def fetch(url: str) -> Any:
        source = "requests_source" in url or "source" in urllib.parse.unquote(url)
        result = ([{"metric": {"topology": "pd1p1d", "source": "entrypoint"}, "value": [1.0, "1"]}]
                  if source else [{"metric": {"topology": "pd1p1d"}, "value": [1.0, "5"]}])
        return {"status": "success", "data": {"resultType": "vector", "result": result}}

    queries = {"ttft_p99_ms": "q1", serverview.SOURCE: "topology:vllm_requests_source:info"}
    rows = serverview.prometheus_rows("http://prom:9090", queries, 7.0, fetch)
    assert rows == [{"time": 7.0, "topology": "pd1p1d", "ttft_p99_ms": 5.0, "requests_source": "entrypoint"}]
    assert serverview.decode_side(serverview.history_frame(rows)) == []


def test_snapshot_without_topologies_is_refused():
    with pytest.raises(ValueError, match="no 'topologies'"):
        serverview.exporter_rows({"targets": []}, 1.0)


def test_the_source_and_level_marks():
    assert serverview.configured_source(AppConfig(SEED_SPEC, SEED_SPEC)) is None
    both = AppConfig(SEED_SPEC, SEED_SPEC, exporter_url="http://e:1", prometheus_url="http://p:2")
    assert serverview.configured_source(both) == ("exporter", "http://e:1")
    marks = serverview.level_marks([LevelMark(1, 60.0, "tp4x1 at 1")])
    assert marks["label"].tolist() == ["tp4x1 at 1"] and marks["time"].iloc[0].minute == 1
    assert serverview.level_marks([]).empty


@pytest.mark.prometheus
@pytest.mark.slow
def test_a_real_prometheus_with_the_generated_rules_feeds_the_server_view():
    from tests.rules.live_stack import live_stack  # the rules suite's shared fleet + Prometheus

    stack = live_stack("seed-70b-h100.yaml")
    stack.fresh_traffic()
    poller = serverview.ServerPoller("prometheus", stack.prometheus.url, stack.spec)
    deadline = time.monotonic() + 60
    latest: Any = None
    while time.monotonic() < deadline:
        poller.poll_once()
        history = poller.history()
        assert history.error is None, history.error
        if not history.frame.empty and {"output_tps", "tpot_p99_ms"} <= set(history.frame.columns):
            latest = history.frame.groupby("topology").last()
            if sorted(latest.index) == ["tp2x2", "tp4x1"] and (latest["output_tps"] > 0).all():
                break
        time.sleep(2)
    assert latest is not None, "Prometheus never answered the recording rules with data"
    assert sorted(latest.index) == ["tp2x2", "tp4x1"]
    assert (latest["output_tps"] > 0).all()
    assert (latest["tpot_p99_ms"] > 0).all()
