"""One bucket-boundary check (crossover.slo.boundary_index), one tolerance: the spec's warning, the
rules' choice of bucket and the exporter's `attainment_exact` (its batched and its per-group path)
agree on every spelling of a threshold, and of a boundary, near 0.05 s."""

from __future__ import annotations

import math

import pytest
import yaml

from crossover import catalog, slo
from crossover.catalog import Metric
from crossover.exporter.parse import ParsedSeries, Parser
from crossover.exporter.quantile import bucket_fraction
from crossover.exporter.state import TargetHealth, build_snapshot
from crossover.exporter.window import History
from crossover.rules.buckets import slo_buckets
from crossover.spec import FleetSpec, parse_spec, slo_warnings, spec_targets
from tests.helpers import SPECS

TPOT = catalog.TPOT
# The TPOT SLO as a spec may write it: 50 ms exactly, or within a relative 1e-9 of it.
ON_BOUNDARY_MS = ("50", "50.0", "5.0e+1", "0.05e+3", "49.99999999999", "50.00000004")
# Off it: a relative 2e-9 is past the tolerance.
OFF_BOUNDARY_MS = ("50.0000001", "49.9999999", "51", "49")
# The 0.05 s boundary as expositions spell it: prometheus_client, Go's shortest form, others.
LE_SPELLINGS = ("0.05", "5e-02", "0.050", "5.0e-2", ".05")


def _spec(tpot_ms: str) -> FleetSpec:
    """The seed spec with its TPOT SLO spelled `tpot_ms` in the YAML, two instances of one topology
    (so the exporter derives them as one batch)."""
    text = (SPECS / "seed-70b-h100.yaml").read_text().replace("tpot_ms: 50 ", f"tpot_ms: {tpot_ms} ", 1)
    data = yaml.safe_load(text)
    assert str(data["slos"]["tpot_ms"]) == tpot_ms or float(data["slos"]["tpot_ms"]) == float(tpot_ms)
    first = data["topologies"][0]
    first.update(gpus=2 * first["tensor_parallel_size"], instances=[
        {"name": f"i{n}", "url": f"http://127.0.0.1:1/{n}"} for n in range(2)])
    first["entrypoint"] = {"balance": "round_robin"}
    data["topologies"] = [first]
    data["scrape"]["windows"] = ["10s"]
    return parse_spec(data)


def _exposition(le: str) -> str:
    """A TPOT histogram with 6 of 10 observations at or below 0.05 s, its boundary spelled `le`."""
    name = TPOT.name
    lines = [f"# TYPE {name} histogram"]
    for bound, count in (("0.025", 2), (le, 6), ("0.1", 9), ("+Inf", 10)):
        lines.append(f'{name}_bucket{{engine="0",le="{bound}",model_name="m"}} {count}')
    lines += [f'{name}_count{{engine="0",model_name="m"}} 10', f'{name}_sum{{engine="0",model_name="m"}} 0.4']
    return "\n".join(lines) + "\n"


def _exporter_exact(spec: FleetSpec, le: str) -> list[tuple[float, bool]]:
    """(attainment, exact) of TPOT for each instance (the batched path) and the topology (merged sums)."""
    parsed = Parser().parse(_exposition(le))
    health = []
    for target in spec_targets(spec):
        history = History(keep_seconds=20.0)
        history.add(0.0, ParsedSeries(parsed.keys, [0.0] * len(parsed.keys)))
        history.add(10.0, parsed)
        health.append(TargetHealth(target, history))
    snapshot = build_snapshot(spec, health, 10.0)
    views = (*snapshot.instances, *snapshot.topologies)
    assert len(views) == 3
    return [(v.windows["10s"].attainment["tpot"].ratio, v.windows["10s"].attainment["tpot"].exact)
            for v in views]


def _rules_bucket(spec: FleetSpec) -> tuple[float, bool]:
    buckets, _ = slo_buckets(spec)
    tpot = next(b for b in buckets if b.slo == "tpot")
    return tpot.le, tpot.exact


def _spec_warns(spec: FleetSpec) -> bool:
    return any("slos.tpot_ms" in w for w in slo_warnings(spec))


@pytest.mark.parametrize("tpot_ms", ON_BOUNDARY_MS)
def test_a_threshold_on_the_boundary_in_any_spelling_is_exact_everywhere(tpot_ms: str) -> None:
    spec = _spec(tpot_ms)
    on = slo.boundary_index(spec.slos.thresholds_ms["tpot"] / 1000.0, TPOT.buckets)
    assert on is not None and TPOT.buckets[on] == 0.05
    assert not _spec_warns(spec)
    assert _rules_bucket(spec) == (0.05, True)
    for le in LE_SPELLINGS:
        assert _exporter_exact(spec, le) == [(0.6, True)] * 3, le


@pytest.mark.parametrize("tpot_ms", OFF_BOUNDARY_MS)
def test_a_threshold_off_the_boundary_is_inexact_everywhere(tpot_ms: str) -> None:
    spec = _spec(tpot_ms)
    assert slo.boundary_index(spec.slos.thresholds_ms["tpot"] / 1000.0, TPOT.buckets) is None
    assert _spec_warns(spec)
    le, exact = _rules_bucket(spec)
    assert not exact and le < spec.slos.thresholds_ms["tpot"] / 1000.0
    for spelled in LE_SPELLINGS[:2]:
        assert [exact for _, exact in _exporter_exact(spec, spelled)] == [False] * 3, spelled


def test_the_sentence_names_the_threshold_the_family_and_both_neighbours() -> None:
    assert slo.not_a_boundary(2000, catalog.TTFT.name, catalog.TTFT.buckets) == (
        f"2000 ms is not a bucket boundary of {catalog.TTFT.name} (neighbours 1000 ms and 2500 ms)")
    assert slo.not_a_boundary(0.5, catalog.TTFT.name, catalog.TTFT.buckets).endswith("(neighbours 1 ms)")
    warning = slo_warnings(_spec("51"), "seed")[0]
    assert warning.startswith(f"seed: slos.tpot_ms: {slo.not_a_boundary(51, TPOT.name, TPOT.buckets)}; ")


def test_boundaries_are_matched_relatively_whatever_their_unit() -> None:
    """Bytes, seconds or a router's milliseconds: the same relative tolerance, no absolute one, and
    a closing +Inf is never a boundary."""
    for scale in (1e-6, 1e-3, 1.0, 1e3, 2.0**33):
        bounds = (0.5 * scale, scale, 2 * scale, math.inf)
        assert slo.boundary_index(scale * (1 + 5e-10), bounds) == 1
        assert slo.boundary_index(scale * (1 - 5e-10), bounds) == 1
        assert slo.boundary_index(scale * (1 + 2e-9), bounds) is None
        assert slo.bucket_neighbours(scale * 1.5, bounds) == (scale, 2 * scale)
    assert slo.boundary_index(3.0, (1.0, 2.0, math.inf)) is None
    assert slo.bucket_neighbours(0.1, (1.0, 2.0)) == (None, 1.0)
    assert slo.bucket_neighbours(3.0, (1.0, 2.0)) == (2.0, None)


def test_a_sub_millisecond_boundary_gets_no_absolute_slack(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spec's check used to add an absolute 1e-12 (seconds) to the exporter's relative 1e-9:
    below a 1 ms boundary the rules then read a bucket as exactly the SLO where the exporter
    interpolated. A 0.1 ms boundary and a threshold 5e-13 s above it: off the boundary for all."""
    buckets = (0.0001, 0.0005, 0.001, 0.01)
    monkeypatch.setitem(slo.SLO_HISTOGRAMS, "tpot", Metric(TPOT.name, TPOT.type, TPOT.help, buckets=buckets))
    threshold_ms = 0.1000000005
    assert not math.isclose(threshold_ms / 1000.0, 0.0001, rel_tol=1e-9)
    assert math.isclose(threshold_ms / 1000.0, 0.0001, rel_tol=1e-9, abs_tol=1e-12)  # the old check's "on"
    seed = _spec("50")
    spec = seed.model_copy(update={"slos": seed.slos.model_copy(update={"tpot_ms": threshold_ms})})
    assert _spec_warns(spec)
    assert _rules_bucket(spec) == (0.0001, False)
    fraction = bucket_fraction(threshold_ms / 1000.0, [(0.0001, 3.0), (0.0005, 5.0), (math.inf, 10.0)])
    assert not fraction.exact
