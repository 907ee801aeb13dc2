"""The background runner's state machine, driven by sweep functions that behave like run_sweep:
they call on_level with LevelDone after each step and return when `stop` is set."""

from __future__ import annotations

import threading
from pathlib import Path

import pandas as pd
import pytest

from crossover.app.runner import RunState, SweepRunner, describe_failure, jobs_in
from crossover.errors import UserError
from crossover.loadgen.analysis.report import CrossoverReport
from crossover.loadgen.sweep import LevelDone
from tests.app.app_fixtures import seed_summary
from tests.helpers import wait_for


def level_done(position: int, total: int) -> LevelDone:
    summary = seed_summary().head(position)
    requests = pd.DataFrame({"topology": ["tp4x1"], "level": [float(position)], "index": [0]})
    # the report's bootstrap count marks which level's report the runner holds
    return LevelDone("tp4x1", float(position), position, total, False, requests, summary,
                     CrossoverReport(bootstrap=position))


def stepping_sweep(steps: int, gate: threading.Semaphore):
    """Reports one level each time the test releases the gate; stops early when asked."""
    def sweep(out_dir: Path, on_level, stop: threading.Event) -> None:
        for position in range(1, steps + 1):
            while not gate.acquire(timeout=0.01):
                if stop.is_set():
                    return
            on_level(level_done(position, steps))
    return sweep


def test_idle_then_running_level_by_level_then_finished(tmp_path):
    runner = SweepRunner()
    assert runner.status().state is RunState.IDLE and not runner.status().state.active
    gate = threading.Semaphore(0)
    runner.start(stepping_sweep(3, gate), tmp_path, levels_total=3, axis="rate")
    status = runner.status()
    assert status.state is RunState.RUNNING and status.levels_done == 0 and status.axis == "rate"
    first_generation = status.generation
    gate.release()
    wait_for(lambda: runner.status().levels_done == 1, 5, "the first level done", poll=0.01)
    status = runner.status()
    assert status.state is RunState.RUNNING
    assert status.summary is not None and len(status.summary) == 1
    assert status.crossover.bootstrap == 1
    assert status.generation > first_generation
    assert status.marks[0].label == "tp4x1 at 1" and status.progress == pytest.approx(1 / 3)
    gate.release()
    gate.release()
    assert runner.join(5)
    status = runner.status()
    assert status.state is RunState.FINISHED and status.levels_done == 3 and status.error is None
    assert len(status.requests()) == 3 and status.ended_at is not None


def test_stop_ends_a_running_sweep_as_stopped(tmp_path):
    runner = SweepRunner()
    gate = threading.Semaphore(0)
    runner.start(stepping_sweep(5, gate), tmp_path, levels_total=5)
    gate.release()
    wait_for(lambda: runner.status().levels_done == 1, 5, "the first level done", poll=0.01)
    runner.stop()
    assert runner.status().state in (RunState.STOPPING, RunState.STOPPED)
    assert runner.join(5)
    assert runner.status().state is RunState.STOPPED and runner.status().levels_done == 1
    runner.stop()  # stopping a stopped sweep changes nothing
    assert runner.status().state is RunState.STOPPED


def test_one_sweep_at_a_time_and_a_new_one_after(tmp_path):
    runner = SweepRunner()
    gate = threading.Semaphore(0)
    runner.start(stepping_sweep(1, gate), tmp_path, levels_total=1)
    with pytest.raises(UserError, match="already running"):
        runner.start(stepping_sweep(1, gate), tmp_path, levels_total=1)
    gate.release()
    assert runner.join(5) and runner.status().state is RunState.FINISHED
    runner.start(stepping_sweep(1, gate), tmp_path / "again", levels_total=1)
    status = runner.status()
    assert status.state is RunState.RUNNING and status.levels_done == 0 and status.summary is None
    gate.release()
    assert runner.join(5)


@pytest.mark.parametrize(("error", "message"), [
    (UserError("plan.levels: give at least one level"), "plan.levels: give at least one level"),
    (RuntimeError("boom\n  at line 3"), "sweep failed: RuntimeError: boom at line 3"),
    (KeyError("x"), "sweep failed: KeyError: 'x'"),
])
def test_a_failing_sweep_is_failed_with_one_readable_line(tmp_path, error, message):
    def sweep(out_dir, on_level, stop):
        on_level(level_done(1, 2))
        raise error

    runner = SweepRunner()
    runner.start(sweep, tmp_path, levels_total=2)
    assert runner.join(5)
    status = runner.status()
    assert status.state is RunState.FAILED and status.error == message
    assert status.levels_done == 1  # what was measured before the failure stays on the page
    assert status.error is not None and "\n" not in status.error


def test_describe_failure_shortens_huge_messages():
    text = describe_failure(ValueError("x" * 1000))
    assert len(text) < 400 and text.endswith("...")


def test_jobs_in_counts_topology_level_pairs():
    assert jobs_in((1, 2, 4), ["a", "b"]) == 6


def child_sweep(behaviour: str, out_dir: Path, on_level, stop) -> None:
    """Runs in the spawned child: one level, then what the test asks for."""
    import os
    import time

    on_level(level_done(1, 2))
    (out_dir / "child-pid").write_text(str(os.getpid()))
    if behaviour == "fail":
        raise RuntimeError("disk full\n  somewhere")
    if behaviour == "die":
        os._exit(3)
    if behaviour == "wait-for-stop":
        while not stop.is_set():
            time.sleep(0.01)
        return
    on_level(level_done(2, 2))


@pytest.mark.parametrize(("behaviour", "state", "levels", "error"), [
    ("finish", RunState.FINISHED, 2, None),
    ("fail", RunState.FAILED, 1, "sweep failed: RuntimeError: disk full somewhere"),
    ("die", RunState.FAILED, 1, "sweep failed: the sweep process ended without a result (exit code 3)"),
])
@pytest.mark.slow
def test_a_sweep_in_a_child_process_reports_like_one_in_a_thread(tmp_path, behaviour, state, levels, error):
    import functools
    import os

    from crossover.app.runner import in_child_process

    runner = SweepRunner()
    runner.start(in_child_process(functools.partial(child_sweep, behaviour)), tmp_path, levels_total=2)
    assert runner.join(60)
    status = runner.status()
    assert (status.state, status.levels_done, status.error) == (state, levels, error)
    assert status.summary is not None and status.crossover.bootstrap == levels
    child = int((tmp_path / "child-pid").read_text())
    assert child != os.getpid()  # measured away from the page's interpreter


@pytest.mark.slow
def test_stop_reaches_a_sweep_in_a_child_process(tmp_path):
    import functools

    from crossover.app.runner import in_child_process

    runner = SweepRunner()
    runner.start(in_child_process(functools.partial(child_sweep, "wait-for-stop")), tmp_path, levels_total=2)
    wait_for(lambda: runner.status().levels_done == 1, 60, "the first level done", poll=0.01)
    runner.stop()
    assert runner.join(30)
    assert runner.status().state is RunState.STOPPED and runner.status().levels_done == 1
