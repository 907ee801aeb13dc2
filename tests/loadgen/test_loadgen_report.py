"""crossover.json through its one reader and writer (loadgen.report): this version's files read and
write back byte for byte, an older version's load, and the load axis' names and scale.

The files under tests/fixtures/crossover-json/ were written by the code, not by hand:
current-adaptive.json by an adaptive sweep (`crossover sweep` on the loopback fake fleet of
test_loadgen_adaptive's crossing_fleet, --slo tpot:40) and current-rate.json by crossings.analyze
on synthetic open-loop requests (a pair with no level in common, a capacity missed at the lowest
level), both by commit 7137a5b, the last before CrossoverReport; before-brackets-962e605.json by
the same adaptive sweep at commit 962e605 (before the goodput metrics took their units and the
answers named their brackets)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from crossover import slo
from crossover.errors import UserError
from crossover.loadgen.analysis.adaptive import AdaptivePlan, adaptive_line, intervals
from crossover.loadgen.analysis.crossings import bracket
from crossover.loadgen.analysis.report import CROSSOVER_FILE, RENAMED, CrossoverReport
from crossover.loadgen.analysis.results import RunInfo, load_run, prepare
from crossover.loadgen.plan import Mode, SweepPlan, TopologyInfo
from tests.helpers import FIXTURES

CROSSOVER_JSON = FIXTURES / "crossover-json"


def _folder_with(tmp_path: Path, fixture: str) -> Path:
    folder = tmp_path / fixture.removesuffix(".json")
    folder.mkdir()
    shutil.copy(CROSSOVER_JSON / fixture, folder / CROSSOVER_FILE)
    return folder


@pytest.mark.parametrize("fixture", ["current-adaptive.json", "current-rate.json"])
def test_this_versions_file_reads_and_writes_back_byte_for_byte(tmp_path: Path, fixture: str) -> None:
    report = CrossoverReport.read(_folder_with(tmp_path, fixture))
    assert report is not None
    out = tmp_path / "written"
    out.mkdir()
    report.write(out)
    assert (out / CROSSOVER_FILE).read_bytes() == (CROSSOVER_JSON / fixture).read_bytes()


def test_a_report_is_typed_data(tmp_path: Path) -> None:
    adaptive = CrossoverReport.read(_folder_with(tmp_path, "current-adaptive.json"))
    assert adaptive is not None and adaptive.axis is Mode.CLOSED and adaptive.bootstrap == 30
    assert {c.axis for c in adaptive.crossovers} == {Mode.CLOSED}
    capacities = [(c.topology, c.censored) for c in adaptive.capacities]
    assert capacities == [("big1x2c", ""), ("small2x1c", "above")]
    state = adaptive.adaptive
    assert state is not None and state.stop_reason == "max-requests" and state.next_level is None
    assert state.levels == (1.0, 6.0, 14.0, 32.0, 21.0, 9.0, 17.0) and state.repeats == {6.0: 2, 14.0: 2}
    assert state.widest is not None and state.widest.what == "output_tps crossing big1x2c/small2x1c"
    assert adaptive_line(state, Mode.CLOSED.axis).startswith(
        "adaptive sweep stopped: the next level would overspend --max-requests; levels measured: "
        "1, 6 (x2), 14 (x2), 32, 21, 9, 17; widest interval: output_tps crossing")
    rate = CrossoverReport.read(_folder_with(tmp_path, "current-rate.json"))
    assert rate is not None and rate.axis is Mode.OPEN and rate.adaptive is None
    apart = next(c for c in rate.crossovers if c.kind == "insufficient")  # no level in common
    assert all(math.isnan(v) for v in apart.level_range) and math.isnan(apart.support) and apart.x is None
    missed = next(c for c in rate.capacities if c.censored == "below")
    assert missed.x is None and missed.per_gpu is None and missed.axis is Mode.OPEN
    assert rate.sentences == [c.sentence for c in rate.crossovers] + [c.sentence for c in rate.capacities]


def test_a_file_from_before_the_brackets_and_the_renames_loads(tmp_path: Path) -> None:
    old = (CROSSOVER_JSON / "before-brackets-962e605.json").read_text()
    assert '"metric": "goodput"' in old and "bracket_low" not in old and "next_repeat" not in old
    report = CrossoverReport.read(_folder_with(tmp_path, "before-brackets-962e605.json"))
    assert report is not None and report.axis is Mode.CLOSED
    metrics = {c.metric for c in report.crossovers}
    assert slo.GOODPUT_REQUESTS in metrics and not metrics & set(RENAMED)
    assert all(c.bracket_low is None and c.bracket_high is None for c in report.crossovers)
    assert all(c.objective == report.objective for c in report.capacities)
    state = report.adaptive
    assert state is not None and state.next_repeat == 1 and state.repeats == {}
    assert state.stop_reason == "target" and state.levels[:2] == (1.0, 6.0) and state.requests > 0
    # the adaptive sweep reads it: without the analysis's brackets, the measured levels either side
    found = intervals(report, AdaptivePlan(metric="goodput"))
    assert found and all(i.between is None for i in found)
    assert found[0].ends(state.levels) == bracket(state.levels, found[0].x)
    # written back as this version writes it, and read again the same
    report.write(tmp_path)
    again = CrossoverReport.read(tmp_path)
    assert again is not None and again.to_json().keys() == report.to_json().keys()
    assert [c.metric for c in again.crossovers] == [c.metric for c in report.crossovers]


def test_a_run_folder_opens_with_an_old_report_or_none(tmp_path: Path) -> None:
    info = RunInfo(plan=SweepPlan(levels=(1, 2)), slos_ms={"tpot": 40.0}, objective=0.95, model="m",
                   topologies={"big1x2c": TopologyInfo("big1x2c", 2, (), "entrypoint")})
    prepare(tmp_path, info)
    empty = load_run(tmp_path).crossover  # no crossover.json yet: nothing found
    assert empty.crossovers == () and empty.axis is Mode.CLOSED and empty.objective == 0.95
    shutil.copy(CROSSOVER_JSON / "before-brackets-962e605.json", tmp_path / CROSSOVER_FILE)
    assert load_run(tmp_path).crossover.sentences


def test_no_file_is_none_and_a_broken_one_is_one_line(tmp_path: Path) -> None:
    assert CrossoverReport.read(tmp_path) is None
    (tmp_path / CROSSOVER_FILE).write_text('{"axis": "concurrency", "crossovers": [')
    with pytest.raises(UserError, match=r"crossover\.json: cannot read it"):
        CrossoverReport.read(tmp_path)
    (tmp_path / CROSSOVER_FILE).write_text('{"axis": "sideways"}')
    with pytest.raises(UserError, match="unknown load axis 'sideways'"):
        CrossoverReport.read(tmp_path)
    (tmp_path / CROSSOVER_FILE).write_text("[]")
    with pytest.raises(UserError, match="not a JSON object"):
        CrossoverReport.read(tmp_path)


def test_the_load_axis_has_one_definition() -> None:
    for mode, name in ((Mode.CLOSED, "concurrency"), (Mode.OPEN, "rate")):
        assert mode.axis == name and Mode.of_axis(name) is mode
        assert SweepPlan(mode=mode, levels=(1, 2), requests_per_level=1).axis == name
    with pytest.raises(ValueError, match="unknown load axis 'closed'"):
        Mode.of_axis("closed")  # run.json's value names the mode, not the axis
    # concurrency on a log2 scale (numbers through math, arrays through numpy), rate as it is
    assert Mode.CLOSED.scale(8.0) == 3.0 and Mode.CLOSED.unscale(3.0) == 8.0
    assert np.array_equal(Mode.CLOSED.scale(np.array([1.0, 2.0, 4.0])), [0.0, 1.0, 2.0])
    assert Mode.OPEN.scale(0.5) == 0.5 and Mode.OPEN.unscale(0.5) == 0.5
    assert Mode.OPEN.scale(np.array([1, 2])).dtype == float
