"""A topology's figures split by a router's extra label (spec: entrypoint.split_by, docs/routers.md):
each value's figures beside the unsplit ones, adding back up to them; nothing changes without it."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from crossover import catalog
from crossover.exporter import dialect
from crossover.exporter.collector import SnapshotCollector
from crossover.exporter.parse import ParsedSeries, Parser
from crossover.exporter.state import Snapshot, TargetHealth, build_snapshot
from crossover.exporter.window import History
from crossover.pdproxy.proxy import EntrypointMetrics
from crossover.spec import ENTRYPOINT_ROLE, FleetSpec, load_spec, spec_targets
from tests.exporter.test_exporter_dialects import _traffic, go_exposition
from tests.helpers import SPECS

# Two priorities' traffic, different in size so that a swapped or doubled split shows.
TOKENS = catalog.GENERATION_TOKENS.name
ITL = catalog.ITL.name  # an engine's, decode-side
TRAFFIC = {"0": (60, 3, 2, 7), "1": (25, 5, 1, 11)}


def _scrapes() -> tuple[ParsedSeries, ParsedSeries]:
    """Two scrapes of one llm-d router carrying both priorities' series."""
    before: list[ParsedSeries] = []
    after: list[ParsedSeries] = []
    for priority, (served, failed, bad, seed) in TRAFFIC.items():
        metrics = EntrypointMetrics("m", "llm-d")
        _traffic(metrics, served=1, failed=1, bad_input=1, seed=1)
        labelled = f'priority="{priority}"'
        before.append(Parser().parse(go_exposition(metrics).replace('priority="0"', labelled)))
        _traffic(metrics, served, failed, bad, seed)
        after.append(Parser().parse(go_exposition(metrics).replace('priority="0"', labelled)))

    def joined(parts: list[ParsedSeries]) -> ParsedSeries:
        # priority "1" without ITL: a split lacks what its own series lack (see the test)
        pairs = [(k, v) for p in parts for k, v in zip(p.keys, p.values, strict=True)
                 if not (k[0].startswith(catalog.LLMD_ITL.name) and ("priority", "1") in k[1])]
        return ParsedSeries(tuple(k for k, _ in pairs), [v for _, v in pairs])
    return joined(before), joined(after)


def _pd_spec(**entrypoint: Any) -> dict[str, Any]:
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d":
            topology["entrypoint"].update(entrypoint)
    return data


def _snapshot(**entrypoint: Any) -> Snapshot:
    data = _pd_spec(dialect="llm-d", **entrypoint)
    data["scrape"].update({"interval": "5s", "timeout": "5s", "windows": ["1m"]})
    spec = FleetSpec.model_validate(data)
    health = [TargetHealth(t, History(70.0)) for t in spec_targets(spec) if t.topology == "pd1p1d"]
    for record in health:
        for when, series in zip((0.0, 60.0), _scrapes(), strict=True):
            if record.target.role != ENTRYPOINT_ROLE:  # an engine: tokens, which no router label splits
                text = (f'# TYPE {TOKENS} counter\n{TOKENS}_total{{model_name="m"}} {when}\n'
                        f'# TYPE {ITL} histogram\n{ITL}_bucket{{model_name="m",le="0.1"}} {when}\n'
                        f'{ITL}_bucket{{model_name="m",le="+Inf"}} {when}\n'
                        f'{ITL}_sum{{model_name="m"}} {when}\n{ITL}_count{{model_name="m"}} {when}\n')
                series = Parser().parse(text)
            read, refused = dialect.read(record.target, series)
            assert refused is None
            record.history.add(when, read)
    return build_snapshot(spec, health, 60.0)


def _exposed(snapshot: Snapshot) -> list[str]:
    registry = CollectorRegistry()
    registry.register(SnapshotCollector(lambda: snapshot))
    return generate_latest(registry).decode().splitlines()


def test_two_priorities_give_two_split_figure_sets_that_add_up_to_the_topology() -> None:
    snapshot = _snapshot(split_by=["priority"])
    (whole,) = [v.windows["1m"] for v in snapshot.topologies if v.topology == "pd1p1d"]
    splits = {v.split: v.windows["1m"] for v in snapshot.splits if v.split is not None}
    rates = {split: f.requests_per_second or 0.0 for split, f in splits.items()}
    assert set(splits) == {("priority", "0"), ("priority", "1")}
    per_second = 1 / 60.0
    for (_, priority), figures in splits.items():
        served, failed, _, _ = TRAFFIC[priority]
        assert figures.requests_per_second == pytest.approx((served + failed) * per_second)
        assert figures.failed_requests_per_second == {"error": pytest.approx(failed * per_second)}
    assert whole.requests_per_second == pytest.approx(sum(rates.values()))
    assert whole.failed_requests_per_second["error"] == pytest.approx(
        sum(f.failed_requests_per_second["error"] for f in splits.values()))
    # A family one split's router series lack stays absent there, never the engines' (unsplit) one
    assert "itl" in splits[("priority", "0")].latency and "itl" not in splits[("priority", "1")].latency
    for kind in ("ttft", "tpot", "e2el"):
        assert whole.latency[kind].observations == pytest.approx(
            sum(f.latency[kind].observations for f in splits.values())), kind
    # attainment: each split's share, weighted by its requests, adds up to the topology's share
    weighted = sum(f.attainment["ttft"].ratio * rates[split] for split, f in splits.items())
    assert weighted == pytest.approx(whole.attainment["ttft"].ratio * sum(rates.values()))
    assert splits[("priority", "0")].attainment["ttft"].ratio != splits[("priority", "1")].attainment[
        "ttft"].ratio
    # exposed beside the unsplit series, one more label, request figures only
    lines = _exposed(snapshot)
    assert any(line.startswith('crossover_topology_requests_per_second{priority="1",topology="pd1p1d"')
               for line in lines)
    assert any(line.startswith('crossover_topology_requests_per_second{topology="pd1p1d",window="1m"}')
               for line in lines)
    assert any(line.startswith("crossover_topology_attainment_ratio{") and 'priority="0"' in line
               for line in lines)
    assert not any(line.startswith("crossover_topology_gpus{") and "priority" in line for line in lines)


def _values(lines: list[str]) -> dict[str, float]:
    return {series: float(value) for series, value in (line.rsplit(" ", 1) for line in lines
                                                       if not line.startswith("#"))}


def test_without_split_by_nothing_is_split_and_the_unsplit_series_stay() -> None:
    split, plain = _snapshot(split_by=["priority"]), _snapshot()
    assert plain.splits == ()
    assert not any('priority="' in line for line in _exposed(plain))
    # The same unsplit series either way; values alike but for float summation order (the router's
    # series are summed before or after the window's reduction).
    kept = _values([line for line in _exposed(split) if 'priority="' not in line])
    before = _values(_exposed(plain))
    assert kept.keys() == before.keys()
    assert all(kept[k] == pytest.approx(v, rel=1e-12, nan_ok=True) for k, v in before.items())


def test_a_label_the_dialect_does_not_declare_lists_the_allowed_ones() -> None:
    with pytest.raises(ValueError, match=r"split_by: 'streaming' is no extra label of dialect llm-d "
                       r"\(allowed: priority, fairness_id, target_model_name\)"):
        FleetSpec.model_validate(_pd_spec(dialect="llm-d", split_by=["streaming"]))
    with pytest.raises(ValueError, match=r"allowed: priority\)"):
        FleetSpec.model_validate(_pd_spec(dialect="vllm", split_by=["fairness_id"]))
