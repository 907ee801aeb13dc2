"""A `crossover capacity --out` folder opens in the app like a run: the loader, and the page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossover.app.capacity_view import load_capacity
from crossover.app.runs import last_change, list_runs
from crossover.cli import main
from crossover.errors import UserError
from tests.app.app_fixtures import spec_file_on_free_ports
from tests.app.test_app_page import open_page
from tests.helpers import SPECS

pytestmark = pytest.mark.slow  # each test plans on the ground truth first (about 5 s)


@pytest.fixture
def plan_dir(tmp_path: Path) -> Path:
    out = tmp_path / "results" / "plan"
    argv = [str(SPECS / "seed-70b-h100.yaml"), "--concurrency", "2-16", "--layouts", "spec"]
    assert main(["capacity", *argv, "--requests", "40", "--workers", "1", "--out", str(out)]) == 0
    return out


def test_the_loader_reads_the_ranking_map_and_pareto_points(plan_dir: Path) -> None:
    saved = json.loads((plan_dir / "capacity.json").read_text())
    plan = load_capacity(plan_dir)
    assert plan.axis == "concurrency" and plan.verdict == saved["verdict"]["sentence"]
    assert list(plan.ranked["layout"]) == [item["label"] for item in saved["layouts"]]
    assert list(plan.ranked["capacity"]) == [item["capacity"]["load"] for item in saved["layouts"]]
    assert list(plan.crossover_map["concurrency"]) == [e["load"] for e in saved["crossover_map"]]
    # Every layout's point along the map is on the chart, and the front is the planner's own.
    assert len(plan.pareto.points) == sum(len(item["along"]) for item in saved["layouts"])
    front = {(p.topology, p.level) for p in plan.pareto.points if p.on_front}
    assert front == {(f["layout"], f["load"]) for f in saved["pareto_front"]}
    listed = list_runs(plan_dir.parent)
    assert [p.path for p in listed] == [plan_dir] and "capacity plan" in listed[0].name
    assert last_change(plan_dir).capacity


def test_a_file_that_is_not_a_plan_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "capacity.json").write_text('{"kind": "something else"}')
    with pytest.raises(UserError, match="not a crossover capacity result"):
        load_capacity(tmp_path)
    (tmp_path / "capacity.json").write_text("{")
    with pytest.raises(UserError, match=r"capacity\.json: not JSON"):
        load_capacity(tmp_path)


def test_the_page_opens_the_plan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, plan_dir: Path) -> None:
    _, spec_path = spec_file_on_free_ports(tmp_path)
    app = open_page(monkeypatch, str(spec_path), "--results", str(plan_dir.parent))
    app.button(key="open_run").click().run()
    assert not app.exception and not app.error, [e.value for e in app.error]
    saved = json.loads((plan_dir / "capacity.json").read_text())
    assert saved["verdict"]["sentence"] in [m.value for m in app.markdown]
    assert len(app.dataframe[0].value) == len(saved["layouts"])
    assert len(app.dataframe[1].value) == len(saved["crossover_map"])
    titles = [s.value for s in app.subheader]
    assert "Throughput per GPU against interactivity" in titles and len(app.get("vega_lite_chart")) == 1
