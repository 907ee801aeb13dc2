"""Generated dashboards: committed JSON is current, the lint passes and can fail, layout is sane."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from crossover import catalog
from crossover.cli import main
from crossover.dashboards.generate import example_outputs
from crossover.dashboards.lint import known_names, lint, metric_names, substitute
from crossover.dashboards.model import DATASOURCE_UID, dashboards
from crossover.dashboards.render import to_json
from crossover.rules.model import build_rules
from crossover.rules.names import REPLICA_LEVEL, failed_requests_name
from crossover.spec import load_spec
from tests.helpers import REPO, SPECS

EXAMPLES = sorted(p.stem for p in SPECS.glob("*.yaml"))


def _generated(stem: str) -> dict[str, dict]:
    folder = REPO / "dashboards" / "generated" / stem
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


def _known(stem: str) -> frozenset[str]:
    return known_names(build_rules(load_spec(SPECS / f"{stem}.yaml")))


def test_committed_dashboards_match_regeneration() -> None:
    stale = [str(path.relative_to(REPO)) for path, text in example_outputs(REPO).items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"regenerate with `python -m crossover.dashboards.generate`: {stale}"


@pytest.mark.parametrize("stem", EXAMPLES)
def test_committed_dashboards_pass_the_lint(stem: str) -> None:
    dashboards_ = _generated(stem)
    pd = any(t.disaggregated for t in load_spec(SPECS / f"{stem}.yaml").topologies)
    assert set(dashboards_) == {"overlay.json", "slo.json"} | ({"pd.json"} if pd else set())
    for name, dashboard in dashboards_.items():
        assert lint(dashboard, _known(stem)) == [], name


def _overlay() -> dict:
    return _generated("pd-8k-prompts")["overlay.json"]


def _first_panel(dashboard: dict) -> dict:
    return next(p for p in dashboard["panels"] if p["type"] != "row")


@pytest.mark.parametrize("break_it, expected", [
    (lambda p: p.update(description=""), "no description"),
    (lambda p: p["fieldConfig"]["defaults"].update(unit=""), "no unit"),
    (lambda p: p.update(datasource={"type": "prometheus", "uid": "abc"}), "datasource variable"),
    (lambda p: p["targets"][0].update(expr='nosuch:metric:rate1m{topology="x"}'), "unknown metric"),
    (lambda p: p["targets"][0].update(expr=catalog.GENERATION_TOKENS.promql_name + '{job="vllm"}'),
     "outside rate()"),
    (lambda p: p["targets"][0].update(
        expr=f'rate({catalog.NUM_PREEMPTIONS.promql_name}{{job="vllm"}}[5m])'), "$__rate_interval"),
    (lambda p: p["gridPos"].update(y=0), "overlap"),
])
def test_the_lint_catches(break_it, expected: str) -> None:
    dashboard = copy.deepcopy(_overlay())
    break_it(_first_panel(dashboard))
    problems = lint(dashboard, _known("pd-8k-prompts"))
    assert any(expected in p for p in problems), problems


def test_the_lint_catches_duplicate_ids_and_a_missing_datasource_variable() -> None:
    dashboard = copy.deepcopy(_overlay())
    dashboard["panels"][2]["id"] = dashboard["panels"][1]["id"]
    variables = dashboard["templating"]["list"]
    dashboard["templating"]["list"] = [v for v in variables if v["name"] != "datasource"]
    problems = lint(dashboard, _known("pd-8k-prompts"))
    assert any("ids not unique" in p for p in problems) and any("no datasource" in p for p in problems)


def test_variables_and_fixed_datasource_uid() -> None:
    dashboard = _overlay()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "model", "topology", "window"}
    assert variables["datasource"]["current"]["value"] == DATASOURCE_UID
    assert variables["topology"]["multi"] and variables["topology"]["includeAll"]
    assert [o["value"] for o in variables["window"]["options"]] == ["1m", "5m"]
    provisioning = REPO / "compose" / "grafana" / "provisioning"
    provisioned = (provisioning / "datasources" / "crossover.yml").read_text()
    assert f"uid: {DATASOURCE_UID}" in provisioned


def test_slo_lines_on_latency_panels_and_every_topology_on_one_panel() -> None:
    panels = {p["title"]: p for p in _overlay()["panels"]}
    tpot = panels["Time per output token (per request)"]
    steps = tpot["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert [s["value"] for s in steps] == [None, 0.025]  # the 30 ms SLO, rounded to the stricter bucket
    assert tpot["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "line"
    for panel in panels.values():
        for target in panel.get("targets", []):
            assert "topology" in target["legendFormat"] or panel["type"] == "stat"


def test_panel_ids_are_stable_and_queries_name_recording_rules() -> None:
    rules = build_rules(load_spec(SPECS / "seed-70b-h100.yaml"))
    first = [json.loads(to_json(d)) for d in dashboards(rules, "seed")]
    again = [json.loads(to_json(d)) for d in dashboards(rules, "seed")]
    assert first == again
    ids = [p["id"] for p in first[0]["panels"]]
    assert ids == list(range(1, len(ids) + 1))
    names = {n for d in first for p in d["panels"] for t in p.get("targets", [])
             for n in metric_names(substitute(t["expr"], {"window": "1m"}))}
    # One raw family, in the output tokens per instance panel; failed requests per instance are the
    # rules' per-replica recording, counted as per topology.
    assert names & rules.record_names and names - rules.record_names <= {
        "up", "ALERTS", catalog.GENERATION_TOKENS.promql_name}
    assert failed_requests_name("1m", REPLICA_LEVEL) in names


def test_cli_writes_dashboards_and_provisioning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = str(SPECS / "pd-8k-prompts.yaml")
    assert main(["dashboards", spec, "--out", str(tmp_path), "--provisioning"]) == 0
    written = {p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()}
    assert written == {"overlay.json", "slo.json", "pd.json", "provisioning/datasources/crossover.yml",
                       "provisioning/dashboards/crossover.yml"}
    assert "stricter neighbour" in capsys.readouterr().err


def test_cli_missing_spec_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("url", ["notaurl", "ftp://prometheus:9090", "http://:9090", "http://p:0", "http://p:abc"])
def test_cli_refuses_a_bad_prometheus_url_in_one_line(url: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboards", str(SPECS / "seed-70b-h100.yaml"), "--out", str(tmp_path), "--provisioning",
                 "--prometheus-url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"crossover dashboards: --prometheus-url: malformed URL {url!r} (")
    assert len(err.splitlines()) == 1
    assert not any(tmp_path.iterdir())
