"""Plain-data dashboards -> Grafana dashboard JSON through grafanalib.

Layout is computed here: each row a full-width row header, its panels left to right in rows of
24 grid units, panel ids numbered in order so they stay stable across regenerations.
"""

from __future__ import annotations

import json
from typing import Any

from grafanalib._gen import DashboardEncoder
from grafanalib.core import (
    Annotations,
    Dashboard,
    GridPos,
    RowPanel,
    Stat,
    Target,
    Templating,
    Threshold,
    Time,
    TimeSeries,
)

from crossover import catalog
from crossover.dashboards import schema
from crossover.dashboards.model import (
    DATASOURCE_UID,
    TOPOLOGY_FILTER,
    DashboardModel,
    Panel,
)
from crossover.rules.names import GPUS_NAME, gauge_sum_name

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_WIDTH = 24
ALERTS_EXPR = 'ALERTS{alertstate="firing",alertname=~"Vllm.+",' + TOPOLOGY_FILTER + "}"


def _variables(model: DashboardModel) -> list[dict[str, Any]]:
    every = {"selected": True, "text": "All", "value": "$__all"}
    return [
        {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
         "current": {"selected": True, "text": "Prometheus", "value": DATASOURCE_UID},
         "hide": 0, "refresh": 1, "regex": "", "options": []},
        {"name": "model", "label": "Model", "type": "query", "datasource": DATASOURCE,
         "query": {"query": f"label_values({gauge_sum_name(catalog.NUM_REQUESTS_RUNNING)}, model_name)",
                   "refId": "model"},
         "includeAll": True, "multi": False, "allValue": ".+", "current": every, "refresh": 2, "sort": 1,
         "hide": 0, "regex": "", "options": []},
        {"name": "topology", "label": "Topology", "type": "query", "datasource": DATASOURCE,
         "query": {"query": f"label_values({GPUS_NAME}, topology)", "refId": "topology"},
         "includeAll": True, "multi": True, "allValue": ".+", "current": every, "refresh": 2, "sort": 1,
         "hide": 0, "regex": "", "options": []},
        {"name": "window", "label": "Window", "type": "custom", "query": ",".join(model.windows),
         "current": {"selected": True, "text": model.windows[0], "value": model.windows[0]},
         "options": [{"selected": i == 0, "text": w, "value": w} for i, w in enumerate(model.windows)],
         "hide": 0, "includeAll": False, "multi": False},
    ]


def _annotations() -> list[dict[str, Any]]:
    return [
        {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
         "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
         "type": "dashboard"},
        # The query in `target`, as Grafana's Prometheus datasource keeps it (schema.clean says where).
        {"name": "Firing alerts", "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": "red",
         "target": {"expr": ALERTS_EXPR, "interval": "1m", "refId": schema.PROMETHEUS_ANNOTATION_REF_ID},
         "titleFormat": "{{alertname}} ({{severity}})",
         "textFormat": "{{topology}} {{slo}}", "tagKeys": "severity,topology", "useValueForTime": False},
    ]


def _thresholds(panel: Panel) -> list[Threshold]:
    steps = [Threshold("green", 0, 0.0)]
    steps += [Threshold(line.color, i + 1, line.value) for i, line in enumerate(panel.lines)]
    return steps


def _right_axis(panel: Panel) -> list[dict[str, Any]]:
    """Overrides that put the right-axis queries on their own scale, with their own lines."""
    overrides = []
    for i, query in enumerate(panel.queries):
        if not query.right_axis:
            continue
        properties: list[dict[str, Any]] = [{"id": "custom.axisPlacement", "value": "right"}]
        if panel.right_label:
            properties.append({"id": "custom.axisLabel", "value": panel.right_label})
        if panel.right_lines:
            steps: list[dict[str, Any]] = [{"color": "transparent", "value": None}]
            steps += [{"color": line.color, "value": line.value} for line in panel.right_lines]
            properties.append({"id": "thresholds", "value": {"mode": "absolute", "steps": steps}})
            properties.append({"id": "custom.thresholdsStyle", "value": {"mode": "line"}})
        overrides.append({"matcher": {"id": "byFrameRefID", "options": chr(ord("A") + i)},
                          "properties": properties})
    return overrides


def _panel(panel: Panel, panel_id: int, grid: GridPos) -> TimeSeries | Stat:
    targets = [Target(expr=q.expr, legendFormat=q.legend, refId=chr(ord("A") + i), datasource=DATASOURCE)
               for i, q in enumerate(panel.queries)]
    if panel.kind == "stat":
        return Stat(title=panel.title, description=panel.description, dataSource=DATASOURCE, targets=targets,
                    format=panel.unit, gridPos=grid, id=panel_id, reduceCalc="lastNotNull",
                    thresholds=[Threshold("green", 0, 0.0), Threshold("red", 1, 1.0)])
    return TimeSeries(title=panel.title, description=panel.description, dataSource=DATASOURCE,
                      targets=targets, unit=panel.unit, gridPos=grid, id=panel_id,
                      thresholds=_thresholds(panel),
                      thresholdsStyleMode="line" if panel.lines else "off",
                      legendDisplayMode="table", legendPlacement="bottom",
                      legendCalcs=["lastNotNull", "max"], tooltipMode="multi",
                      overrides=_right_axis(panel),
                      # Through extraJson: grafanalib's valueMin/valueMax take ints only, an axis a float.
                      extraJson=_axis_range(panel))


def _axis_range(panel: Panel) -> dict[str, Any] | None:
    bounds = {k: v for k, v in (("min", panel.min), ("max", panel.max)) if v is not None}
    return {"fieldConfig": {"defaults": bounds}} if bounds else None


def build(model: DashboardModel) -> Dashboard:
    panels: list[Any] = []
    next_id = 1
    y = 0
    for row in model.rows:
        panels.append(RowPanel(title=row.title, gridPos=GridPos(h=1, w=GRID_WIDTH, x=0, y=y), id=next_id,
                               collapsed=False))
        next_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > GRID_WIDTH:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel(panel, next_id, GridPos(h=panel.height, w=panel.width, x=x, y=y)))
            next_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return Dashboard(
        title=model.title, uid=model.uid, description=model.description, tags=list(model.tags),
        panels=panels, templating=Templating(list=_variables(model)),
        annotations=Annotations(list=_annotations()),
        time=Time("now-30m", "now"), refresh="10s", timezone="browser", editable=True, graphTooltip=1)


def to_json(model: DashboardModel) -> str:
    """The dashboard as Grafana's own schema has it (schema.clean), refused with one line naming the
    panel and field when it would not load (schema.validate)."""
    data = schema.clean(json.loads(json.dumps(build(model).to_json_data(), cls=DashboardEncoder)))
    schema.validate(data, model.uid)
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"
