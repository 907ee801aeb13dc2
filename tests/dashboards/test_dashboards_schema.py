"""The dashboards against Grafana's own schema (@grafana/schema, crossover.dashboards.schema): the
committed ones and what `crossover dashboards` writes type-check clean against every pinned version,
a dashboard broken in each way fails the check, and a model that would give a file Grafana rejects
fails at generation with one line naming the panel and field."""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover.cli import main
from crossover.dashboards import schema
from crossover.dashboards.model import Line, dashboards
from crossover.dashboards.render import to_json
from crossover.errors import UserError
from crossover.rules.model import build_rules
from crossover.spec import load_spec
from tests.helpers import REPO, SPECS, require

COMMITTED = sorted((REPO / "dashboards" / "generated").glob("*/*.json"))


def _require_schema(version: str) -> None:
    require(shutil.which("node") is not None, "node is not installed (run `make test`, which installs it)")
    try:
        schema.package_root(version)
    except schema.SchemaToolMissing as exc:
        require(False, f"{exc} (run `make test`, which installs it)")


def _first_panel(dashboard: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(p for p in dashboard["panels"] if p["type"] == kind)


def _broken() -> dict[str, dict[str, Any]]:
    """One dashboard per way of breaking it, named by what is wrong."""
    base = json.loads((REPO / "dashboards/generated/pd-8k-prompts/overlay.json").read_text())
    broken = {}
    null = copy.deepcopy(base)
    _first_panel(null, "timeseries")["description"] = None
    broken["null"] = null
    unknown = copy.deepcopy(base)
    _first_panel(unknown, "timeseries")["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["index"] = 1
    broken["unknown field"] = unknown
    enum = copy.deepcopy(base)
    _first_panel(enum, "timeseries")["options"]["legend"]["displayMode"] = "tabel"
    broken["bad enum"] = enum
    plugin = copy.deepcopy(base)
    _first_panel(plugin, "stat")["options"]["colorMode"] = "rainbow"
    broken["bad plugin option"] = plugin
    resource = schema.resource_v1(copy.deepcopy(base))
    resource["metadata"]["title"] = "not a metadata field"
    broken["bad V1 metadata"] = resource
    return broken


@pytest.mark.slow
@pytest.mark.parametrize("version", schema.SCHEMA_PACKAGE_VERSIONS)
def test_dashboards_type_check_against_grafana_schema_and_broken_ones_fail(version: str,
                                                                          tmp_path: Path) -> None:
    _require_schema(version)
    # What a user gets from the CLI, for a P/D fleet (all three dashboards), beside the committed ones.
    # And the same as Grafana 12.2+ V1 resources (the classic model as spec).
    spec = str(SPECS / "pd-8k-prompts.yaml")
    assert main(["dashboards", spec, "--out", str(tmp_path / "classic")]) == 0
    assert main(["dashboards", spec, "--out", str(tmp_path / "v1"), "--form", "v1"]) == 0
    written = sorted(tmp_path.glob("*/*.json"))
    assert {p.relative_to(tmp_path).as_posix() for p in written} == {
        f"{form}/{name}.json" for form in ("classic", "v1") for name in ("overlay", "slo", "pd")}
    for path in tmp_path.glob("v1/*.json"):
        resource = json.loads(path.read_text())
        assert resource["apiVersion"] == schema.V1_API_VERSION and resource["kind"] == "Dashboard"
        assert resource["spec"] == json.loads((tmp_path / "classic" / path.name).read_text())
        assert resource["metadata"] == {"name": resource["spec"]["uid"]}
    good = {str(p): json.loads(p.read_text()) for p in [*COMMITTED, *written]}
    assert len(COMMITTED) >= 16
    broken = _broken()
    problems = schema.check({**good, **broken}, version)  # one tsc run for all of them
    by_dashboard: dict[str, list[str]] = {}
    for problem in problems:
        by_dashboard.setdefault(problem.dashboard, []).append(f"{problem.where}: {problem.message}")
    assert not set(by_dashboard) & set(good), "\n".join(str(p) for p in problems if p.dashboard in good)
    expect = {"null": "'null' is not assignable", "unknown field": '"index"',
              "bad enum": '"tabel"', "bad plugin option": '"rainbow"', "bad V1 metadata": '"title"'}
    for name, text in expect.items():
        found = by_dashboard.get(name, [])
        assert any(text in p for p in found), f"{name}: {found}"
        # The problem names the panel it is in (tsc's line mapped back to the panel).
        assert all(("panel '" if name != "bad V1 metadata" else "V1 resource") in p for p in found), found


@pytest.mark.parametrize("version", schema.SCHEMA_PACKAGE_VERSIONS)
def test_schema_version_is_the_packages_current_one(version: str) -> None:
    _require_schema(version)
    assert schema.package_schema_version(version) == schema.SCHEMA_VERSION
    for path in COMMITTED:
        assert json.loads(path.read_text())["schemaVersion"] == schema.SCHEMA_VERSION, path


def test_compose_pins_the_checked_grafana() -> None:
    compose = yaml.safe_load((REPO / "compose/docker-compose.yml").read_text())
    image = compose["services"]["grafana"]["image"]
    assert image == f"${{GRAFANA_IMAGE:-grafana/grafana:{schema.COMPOSE_GRAFANA_VERSION}}}"
    env = (REPO / "compose/.env.example").read_text()
    assert f"GRAFANA_IMAGE=grafana/grafana:{schema.COMPOSE_GRAFANA_VERSION}\n" in env
    assert schema.COMPOSE_GRAFANA_VERSION in schema.SCHEMA_PACKAGE_VERSIONS
    assert schema.COMPOSE_GRAFANA_VERSION.startswith("13.")


def _nulls(value: Any, path: str = "") -> list[str]:
    if value is None:
        return [path]
    if isinstance(value, dict):
        return [n for k, v in value.items() for n in _nulls(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [n for i, v in enumerate(value) for n in _nulls(v, f"{path}[{i}]")]
    return []


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_committed_json_is_clean(path: Path) -> None:
    """No null but the base threshold step's (the schema's number|null, Grafana's -Infinity), none of
    grafanalib's legacy fields, the annotation's query in its target."""
    dashboard = json.loads(path.read_text())
    nulls = _nulls(dashboard)
    assert all(re.search(r"\.thresholds\.steps\[0\]\.value$", n) for n in nulls), nulls
    assert not set(dashboard) & schema.LEGACY_DASHBOARD_FIELDS
    for panel in dashboard["panels"]:
        assert not set(panel) & schema.LEGACY_PANEL_FIELDS
        for target in panel.get("targets", []):
            assert not set(target) & schema.LEGACY_TARGET_FIELDS
    assert all("definition" not in v for v in dashboard["templating"]["list"])
    prometheus = [a for a in dashboard["annotations"]["list"] if a["datasource"]["type"] == "prometheus"]
    assert prometheus and all("expr" not in a and a["target"]["expr"] for a in prometheus)


def test_clean_works_on_any_panel_type() -> None:
    """A panel type the generator does not use yet (the Pareto panel, say) is cleaned the same way."""
    steps = [{"color": "green", "value": "null", "index": 0}, {"color": "red", "value": 1, "op": "gt"}]
    defaults = {"decimals": None, "thresholds": {"mode": "absolute", "steps": steps}}
    legacy = {"schemaVersion": 12, "style": "dark", "rows": [], "gnetId": None,
              "panels": [{"type": "xychart", "id": 1, "title": "x", "span": None, "error": False,
                          "options": {"legend": {"displayMode": "list", "placement": "bottom", "calcs": []}},
                          "fieldConfig": {"defaults": defaults, "overrides": []},
                          "targets": [{"expr": "up", "refId": "A", "intervalFactor": 2, "metric": ""}]}]}
    cleaned = schema.clean(legacy)
    panel = cleaned["panels"][0]
    assert cleaned["schemaVersion"] == schema.SCHEMA_VERSION
    assert "style" not in cleaned and "gnetId" not in cleaned
    assert "span" not in panel and "error" not in panel and "decimals" not in panel["fieldConfig"]["defaults"]
    assert panel["fieldConfig"]["defaults"]["thresholds"]["steps"] == [{"color": "green", "value": None},
                                                                       {"color": "red", "value": 1}]
    assert panel["targets"] == [{"expr": "up", "refId": "A"}]
    assert panel["options"]["legend"]["showLegend"] is True


def _models() -> tuple[Any, ...]:
    return dashboards(build_rules(load_spec(SPECS / "pd-8k-prompts.yaml")), "pd-8k-prompts")


def _with_first_panel(model: Any, **changes: Any) -> Any:
    row = model.rows[0]
    panel = dataclasses.replace(row.panels[0], **changes)
    return dataclasses.replace(model, rows=(dataclasses.replace(row, panels=(panel, *row.panels[1:])),
                                            *model.rows[1:]))


@pytest.mark.parametrize("changes, field", [
    ({"lines": (Line(math.nan),)}, "not a finite number"),
    ({"lines": (Line(math.inf),)}, "not a finite number"),
    ({"min": 1.0, "max": 0.0}, "fieldConfig.defaults.min/max"),
    ({"width": 30}, "gridPos"),
    ({"height": 0}, "gridPos.h"),
    ({"lines": (Line(2.0), Line(1.0))}, "thresholds.steps"),
])
def test_bad_panel_options_fail_at_generation_in_one_line(changes: dict[str, Any], field: str) -> None:
    model = _models()[0]
    bad = _with_first_panel(model, **changes)
    title = bad.rows[0].panels[0].title
    with pytest.raises(UserError) as info:
        to_json(bad)
    message = str(info.value)
    assert "\n" not in message and f"panel {title!r}" in message and field in message, message
    assert message.startswith(f"dashboard {model.uid}: ")
