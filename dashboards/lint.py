"""A dashboard linter in the spirit of grafana/dashboard-linter, plus vLLM's generator check that
every metric a query names exists.

`lint(dashboard_json, known_names)` returns one line per problem (empty: clean). Rules: every panel
uses the datasource variable and has a title, unit and description; raw counters and histogram
series appear only inside rate()/increase() over $__rate_interval; panel ids are unique; grid
positions do not overlap; every metric or recording-rule name a query (or annotation) uses is
known (the catalog, the generated rules, the exporter's names, Prometheus built-ins).
"""

from __future__ import annotations

import re
from typing import Any

from crossover import catalog
from crossover.catalog import MetricType
from crossover.exporter.names import EXPORTED_NAMES
from crossover.rules.model import RuleSet

DATASOURCE_VARIABLE = "${datasource}"
BUILTIN_NAMES = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE"})
# A selector: a metric name directly followed by `{` (every query here names its labels).
_SELECTOR = re.compile(r"(?<![\w:])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
# A label-matcher block, which may contain Grafana variables such as ${model}.
_LABELS = r"\{(?:[^{}]|\$\{\w+\})*\}"
_VARIABLE = re.compile(r"\$\{(\w+)\}|\$(\w+)")


def counter_like_names() -> frozenset[str]:
    """Raw series that only make sense under rate(): counters and histogram parts."""
    rated = (MetricType.COUNTER, MetricType.HISTOGRAM)
    return frozenset(name for metric in catalog.CATALOG.metrics if metric.type in rated
                     for name in metric.sample_names)


def known_names(rules: RuleSet) -> frozenset[str]:
    names = {n for metric in catalog.CATALOG.metrics for n in metric.sample_names}
    return frozenset(names | set(rules.record_names) | BUILTIN_NAMES | EXPORTED_NAMES)


def substitute(expr: str, values: dict[str, str]) -> str:
    """Replace $name and ${name} by values[name] (unknown variables left as they are)."""
    return _VARIABLE.sub(lambda match: values.get(match.group(1) or match.group(2), match.group(0)), expr)


def metric_names(expr: str) -> list[str]:
    return [name for name in _SELECTOR.findall(expr) if name not in ("by", "without", "on", "ignoring")]


def _window_values(dashboard: dict[str, Any]) -> list[str]:
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("name") == "window":
            return [o["value"] for o in variable.get("options", [])]
    return []


def _overlaps(a: dict[str, int], b: dict[str, int]) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and \
        b["y"] < a["y"] + a["h"]


def annotation_expr(annotation: dict[str, Any]) -> str:
    """The PromQL of a Prometheus annotation: in `target` as Grafana's Prometheus datasource keeps it
    (crossover.dashboards.schema), or at the root in the legacy form."""
    return str((annotation.get("target") or {}).get("expr") or annotation.get("expr") or "")


def lint(dashboard: dict[str, Any], known: frozenset[str]) -> list[str]:
    problems: list[str] = []
    counters = counter_like_names()
    windows = _window_values(dashboard) or [""]
    variables = {v.get("name") for v in dashboard.get("templating", {}).get("list", [])}
    if "datasource" not in variables:
        problems.append("dashboard: no datasource template variable")
    panels = dashboard.get("panels", [])
    ids = [p.get("id") for p in panels]
    duplicates = sorted({i for i in ids if ids.count(i) > 1 or i is None}, key=str)
    if duplicates:
        problems.append(f"dashboard: panel ids not unique or missing: {duplicates}")
    for i, a in enumerate(panels):
        for b in panels[i + 1:]:
            if _overlaps(a["gridPos"], b["gridPos"]):
                problems.append(f"panels {a.get('title')!r} and {b.get('title')!r} overlap")
    expressions: list[tuple[str, str]] = []
    for panel in panels:
        title = panel.get("title") or f"panel {panel.get('id')}"
        if panel.get("type") == "row":
            continue
        if not panel.get("title"):
            problems.append(f"{title}: no title")
        if not panel.get("description"):
            problems.append(f"{title}: no description")
        if not panel.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"{title}: no unit")
        if (panel.get("datasource") or {}).get("uid") != DATASOURCE_VARIABLE:
            problems.append(f"{title}: does not use the datasource variable")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{title}: no queries")
        for target in targets:
            if (target.get("datasource") or {}).get("uid") != DATASOURCE_VARIABLE:
                problems.append(f"{title}: a query does not use the datasource variable")
            expressions.append((title, target.get("expr", "")))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation_expr(annotation):
            expressions.append((f"annotation {annotation.get('name')}", annotation_expr(annotation)))
    for title, expr in expressions:
        for window in windows:
            text = substitute(expr, {"window": window})
            for name in metric_names(text):
                if name not in known:
                    problems.append(f"{title}: unknown metric {name!r} in {text!r}")
        for name in counters:
            for match in re.finditer(rf"(?<![\w:]){re.escape(name)}\s*{_LABELS}(\[[^\]]*\])?", expr):
                before = expr[: match.start()].rstrip()
                under_rate = re.search(r"(rate|increase)\(\s*$", before) is not None
                if not under_rate:
                    problems.append(f"{title}: counter {name} outside rate()/increase()")
                elif match.group(1) != "[$__rate_interval]":
                    problems.append(f"{title}: rate over {name} should use [$__rate_interval]")
    return sorted(set(problems), key=problems.index)
