"""Live: every query of every panel (and the alert annotation), with the variables substituted as
Grafana would, returns data from a real Prometheus that scrapes the simulated P/D fleet with the
generated rules. A panel that would show "No data" fails; so does a topology missing from a panel
meant to show every topology. The P/D spec covers all three dashboards (colocated and 1P+1D)."""

from __future__ import annotations

import json
import time

import pytest

from crossover import catalog
from crossover.dashboards.lint import annotation_expr, substitute
from crossover.dashboards.model import dashboards
from crossover.dashboards.render import to_json
from crossover.rules import model as m
from crossover.rules.names import rate_name
from tests.rules.live_stack import LiveStack, live_stack

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
SPEC = "pd-8k-prompts.yaml"


@pytest.fixture(scope="module")
def stack() -> LiveStack:
    stack = live_stack(SPEC)
    stack.fresh_traffic()
    rate = rate_name(catalog.GENERATION_TOKENS, "1m")
    count = len(stack.spec.topologies)
    stack.prometheus.wait_until(lambda: len(stack.prometheus.query(f"{rate} > 0")) == count,
                                60, f"{rate} > 0 for every topology")
    stack.wait_for_every_group()
    return stack


def _queries(stack: LiveStack) -> list[tuple[str, str, str, str]]:
    """(dashboard, panel, scope, expr) for every target of every panel, and the annotation."""
    out = []
    from crossover.dashboards.model import Panel

    for model in dashboards(stack.rules, "live"):
        scopes = {p.title: p.scope for p in model.panels if isinstance(p, Panel)}
        data = json.loads(to_json(model))
        for panel in data["panels"]:
            for target in panel.get("targets", []):
                out.append((model.uid, panel["title"], scopes[panel["title"]], target["expr"]))
        for annotation in data["annotations"]["list"]:
            if annotation_expr(annotation):
                out.append((model.uid, annotation["name"], "annotation", annotation_expr(annotation)))
    return out


def _panels_without_data(stack: LiveStack) -> tuple[int, list[str]]:
    """(queries checked, those that return no data or miss a topology they should show)."""
    everyone = {t.name for t in stack.spec.topologies}
    pd = set(m.disaggregated_topologies(stack.spec))
    # Grafana's values for "All" and for a multi-select of every topology; the spec's windows.
    model = stack.spec.model.name.replace(".", "\\\\.")
    selections = [{"topology": ".+", "model": ".+"}, {"topology": "|".join(sorted(everyone)), "model": model}]
    failures = []
    checked = 0
    for dashboard, title, scope, expr in _queries(stack):
        if scope == "annotation":
            continue  # ALERTS exists only while an alert fires; checked below
        for window in stack.rules.dashboard_windows:
            for selection in selections:
                text = substitute(expr, {**selection, "window": window, "__rate_interval": "1m"})
                samples = stack.prometheus.query(text)
                checked += 1
                topologies = {s.labels.get("topology") for s in samples}
                want = {"all": everyone, "pd": pd, "any": set()}[scope]
                if not samples or not want <= topologies:
                    failures.append(f"{dashboard} / {title}: {text} -> {sorted(map(str, topologies))}")
    return checked, failures


def test_every_panel_query_returns_data_for_every_topology(stack: LiveStack) -> None:
    # The fixture waits for data in each group's last record, from any topology: a long-window group
    # that evaluated before one topology's 1m records had a sample shows it only a minute later.
    deadline = time.monotonic() + stack.evaluations_s
    checked, failures = _panels_without_data(stack)
    while failures and time.monotonic() < deadline:
        time.sleep(5)
        checked, failures = _panels_without_data(stack)
    assert checked > 100
    assert not failures, "panels without data:\n" + "\n".join(failures)


def test_alert_annotation_query_is_valid_promql(stack: LiveStack) -> None:
    annotations = [expr for _, _, scope, expr in _queries(stack) if scope == "annotation"]
    assert annotations, "no dashboard has the firing-alerts annotation"
    for expr in annotations:
        stack.prometheus.query(substitute(expr, {"topology": ".+"}))  # raises on a PromQL error
