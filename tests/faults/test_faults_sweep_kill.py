"""`kill -9` in the middle of `crossover sweep`: at most the level in flight is lost, and the rerun
resumes (finished levels are not re-run, the final results are complete).

The sweep runs as a real `crossover sweep` subprocess against the simulated fleet (on this
process's loopback); it is killed as soon as the first level's results are on disk, while the next
level is in flight.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml

from crossover.loadgen.analysis.results import LEVELS_DIR, RUN_FILE, RunInfo, load_run
from crossover.loadgen.sweep import LevelDone, run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import SimFleet, running_fleet, with_overrides
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS

pytestmark = pytest.mark.timeout(180)

LEVELS = (1, 2, 3)
REQUESTS = 3
TOPOLOGIES = ("tp4x1", "tp2x2")


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[SimFleet, FleetSpec, Path]]:
    # Half speed, so each level lasts a second or more: long enough to kill the sweep inside one.
    spec = with_overrides(spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")), time_scale=0.5)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    with running_fleet(spec) as running:
        yield running, spec, path


def _sweep(spec_path: Path, out: Path, log: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "crossover", "sweep", str(spec_path), "--out", str(out),
               "--concurrency", ",".join(map(str, LEVELS)), "--requests", str(REQUESTS),
               "--input-len", "32", "--output-len", "24", "--bootstrap", "0", "--no-progress",
               "--timeout", "60"]
    with log.open("wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "COLUMNS": "200"})


def _finished(out: Path) -> set[tuple[str, str]]:
    return {(p.parent.name, p.stem) for p in (out / LEVELS_DIR).glob("*/*.parquet")}


def _served(fleet: SimFleet, spec: FleetSpec) -> set[str]:
    return {r["id"] for t in spec.topologies for i in t.instances for r in fleet.requests(i.name)}


@pytest.mark.slow
def test_kill_9_mid_sweep_loses_at_most_the_level_in_flight_and_resumes(
        fleet: tuple[SimFleet, FleetSpec, Path], tmp_path: Path) -> None:
    running, spec, spec_path = fleet
    out = tmp_path / "run"
    first_level = {(t, "c1") for t in TOPOLOGIES}
    sweep = _sweep(spec_path, out, tmp_path / "first.log")
    try:
        deadline = time.monotonic() + 90
        while not first_level <= _finished(out):
            assert sweep.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
            assert time.monotonic() < deadline, "the first level was never written"
            time.sleep(0.05)
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(10)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait(10)
    assert sweep.returncode == -signal.SIGKILL
    survived = _finished(out)
    assert first_level <= survived
    assert survived != {(t, f"c{lv}") for t in TOPOLOGIES for lv in LEVELS}, "killed too late to test"
    before = {key: (out / LEVELS_DIR / key[0] / f"{key[1]}.parquet").read_bytes() for key in survived}
    # every file that survived is a whole level, readable, with every request of the level
    for topology, level in survived:
        frame = pd.read_parquet(out / LEVELS_DIR / topology / f"{level}.parquet")
        assert len(frame) == REQUESTS and frame["ok"].all(), (topology, level)
    served_before = _served(running, spec)

    # The rerun, in this process (a second CLI start costs ~10 s on a loaded machine), with the
    # plan the killed CLI wrote: the same experiment, so it must resume rather than refuse.
    plan = RunInfo.from_json(json.loads((out / RUN_FILE).read_text())).plan
    events: list[LevelDone] = []
    result = run_sweep(spec, plan, out, on_level=events.append, n_boot=0)
    assert not result.stopped
    # finished levels are not re-run: byte-identical files, reported as resumed, no new requests
    for key, content in before.items():
        assert (out / LEVELS_DIR / key[0] / f"{key[1]}.parquet").read_bytes() == content, key
    assert {(e.topology, f"c{e.level:g}") for e in events if e.resumed} == survived
    assert len(events) == len(LEVELS) * len(TOPOLOGIES)
    run = load_run(out)
    assert len(run.requests) == REQUESTS * len(LEVELS) * len(TOPOLOGIES)
    assert run.requests["ok"].all(), run.requests["error"].unique()
    assert not run.requests.duplicated(["topology", "level", "index"]).any()
    new_ids = set(run.requests["completion_id"]) - served_before
    resumed = run.requests.set_index(["topology", "level"]).index.isin(
        [(t, float(lv[1:])) for t, lv in survived])
    assert set(run.requests.loc[resumed, "completion_id"]) <= served_before
    assert set(run.requests.loc[~resumed, "completion_id"]) == new_ids
    assert len(new_ids) == REQUESTS * (len(LEVELS) * len(TOPOLOGIES) - len(survived))
    assert len(run.summary) == len(LEVELS) * len(TOPOLOGIES)
