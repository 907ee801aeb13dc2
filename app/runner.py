r"""The background sweep: one thread per sweep, owned by a runner the page keeps between reruns.

The app's sweeps run in a child process (`in_child_process`): Streamlit reruns the page in the
same interpreter, and a rerun that draws charts holds the GIL for tens of milliseconds, long
enough to delay the client's token stamps and bias the very latencies the sweep measures. The
thread here only relays what the child reports.

The page never waits on the sweep. It calls `start` and `stop` and reads `status()`, a plain
snapshot taken under a lock; everything the sweep reports arrives through `on_level`. The runner
is a small state machine:

    idle --start--> running --(last level)--> finished
                      |  \--(error)---------> failed
                      \--stop--> stopping --> stopped
    finished / failed / stopped --start--> running
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pandas as pd

from crossover.errors import UserError
from crossover.loadgen.analysis.adaptive import AdaptivePlan
from crossover.loadgen.analysis.report import CrossoverReport
from crossover.loadgen.plan import Mode, SweepPlan
from crossover.loadgen.sweep import LevelDone, run_sweep
from crossover.spec import FleetSpec


class RunState(StrEnum):
    IDLE = "idle"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"

    @property
    def active(self) -> bool:
        return self in (RunState.RUNNING, RunState.STOPPING)


@dataclass(frozen=True)
class LevelMark:
    """When the sweep reported a level done (unix time), for marking server-side charts."""

    index: int
    finished_at: float
    label: str


@dataclass(frozen=True)
class RunStatus:
    state: RunState = RunState.IDLE
    out_dir: Path | None = None
    axis: str = Mode.CLOSED.axis  # the plan's load axis by its name (Mode.axis): "concurrency" or "rate"
    started_at: float | None = None
    ended_at: float | None = None
    levels_done: int = 0
    levels_total: int = 0
    marks: tuple[LevelMark, ...] = ()
    error: str | None = None
    generation: int = 0  # grows with every start and every finished level: a cache key for results
    summary: pd.DataFrame | None = None  # per topology x level, as of the last finished level
    crossover: CrossoverReport = field(default_factory=CrossoverReport)  # the analysis as of then
    request_frames: tuple[pd.DataFrame, ...] = ()  # each finished level's requests

    def requests(self) -> pd.DataFrame:
        return pd.concat(self.request_frames, ignore_index=True) if self.request_frames else pd.DataFrame()

    @property
    def progress(self) -> float:
        return min(1.0, self.levels_done / self.levels_total) if self.levels_total else 0.0


# (out_dir, on_level, stop) -> anything: crossover.loadgen.sweep.run_sweep with the spec, plan and
# topologies bound; it writes its results under out_dir and calls on_level after every level.
SweepFunction = Callable[[Path, Callable[[LevelDone], None], threading.Event], Any]


class SweepProcessFailed(Exception):
    """The child process's sweep failed; the message is already one readable line."""


def describe_failure(exc: BaseException) -> str:
    """One readable line for any exception: the user's mistake as-is, anything else named."""
    if isinstance(exc, UserError | SweepProcessFailed):
        return str(exc)
    text = " ".join(str(exc).split()) or type(exc).__name__
    if len(text) > 300:
        text = text[:297] + "..."
    return f"sweep failed: {type(exc).__name__}: {text}" if str(exc) else f"sweep failed: {text}"


@dataclass
class SweepRunner:
    """Runs one sweep at a time in a daemon thread; safe to call from any Streamlit rerun."""

    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _status: RunStatus = field(default_factory=RunStatus)
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)

    def status(self) -> RunStatus:
        with self._lock:
            return self._status

    def start(self, sweep: SweepFunction, out_dir: Path, levels_total: int,
              axis: str = Mode.CLOSED.axis) -> None:
        """Start a sweep; a UserError if one is already running."""
        with self._lock:
            if self._status.state.active:
                raise UserError("a sweep is already running; stop it first")
            self._stop = threading.Event()
            self._status = RunStatus(state=RunState.RUNNING, out_dir=out_dir, axis=axis,
                                     started_at=time.time(), levels_total=levels_total,
                                     generation=self._status.generation + 1)
            stop = self._stop
            self._thread = threading.Thread(target=self._run, args=(sweep, out_dir, stop),
                                            name="crossover-app-sweep", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Ask the sweep to stop; it finishes the request in flight and returns soon after."""
        with self._lock:
            if self._status.state is RunState.RUNNING:
                self._status = replace(self._status, state=RunState.STOPPING)
                self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the sweep thread; True when no sweep is running any more."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.status().state.active

    def _on_level(self, done: LevelDone) -> None:
        label = f"{done.topology} at {done.level:g}" + (" (resumed)" if done.resumed else "")
        with self._lock:
            mark = LevelMark(index=done.position, finished_at=time.time(), label=label)
            self._status = replace(
                self._status, levels_done=done.position, levels_total=done.total,
                marks=(*self._status.marks, mark), generation=self._status.generation + 1,
                summary=done.summary, crossover=done.crossover,
                request_frames=(*self._status.request_frames, done.requests))

    def _run(self, sweep: SweepFunction, out_dir: Path, stop: threading.Event) -> None:
        error: str | None = None
        try:
            sweep(out_dir, self._on_level, stop)
        except BaseException as exc:
            error = describe_failure(exc)
        final = _final_crossover(out_dir)  # an adaptive sweep decides to stop after its last level
        with self._lock:
            if error is not None:
                state = RunState.FAILED
            elif stop.is_set():
                state = RunState.STOPPED
            else:
                state = RunState.FINISHED
            self._status = replace(self._status, state=state, error=error, ended_at=time.time(),
                                   generation=self._status.generation + 1,
                                   crossover=final if final is not None else self._status.crossover)


def _final_crossover(out_dir: Path) -> CrossoverReport | None:
    """crossover.json as the sweep left it, or None when it wrote none (or it cannot be read)."""
    try:
        return CrossoverReport.read(out_dir)
    except UserError:
        return None


def _child_main(sweep: SweepFunction, out_dir: Path, events: Connection, stop: Any) -> None:
    """The child process: run the sweep, report each level, then how it ended. A pipe, not a
    queue: send() returns once the report is in the pipe, so a level reported is never lost
    to a child that dies right after."""
    try:
        sweep(out_dir, lambda done: events.send(("level", done)), stop)
    except BaseException as exc:
        events.send(("failed", describe_failure(exc)))
    else:
        events.send(("done", None))


def in_child_process(sweep: SweepFunction, poll_s: float = 0.1) -> SweepFunction:
    """The same sweep, run in a spawned child process (picklable `sweep` needed): on_level and
    stop work as before, relayed through a queue and a process-shared event. A child that dies
    without a word (killed, out of memory) is a failure naming its exit code; the levels it
    finished are already on disk."""
    def run(out_dir: Path, on_level: Callable[[LevelDone], None], stop: threading.Event) -> None:
        context = multiprocessing.get_context("spawn")  # fork would copy Streamlit's threads' locks
        events, child_end = context.Pipe(duplex=False)
        child_stop = context.Event()
        child = context.Process(target=_child_main, args=(sweep, out_dir, child_end, child_stop),
                                name="crossover-app-sweep", daemon=True)
        child.start()
        child_end.close()  # the child holds its copy: EOF here once the child is gone
        try:
            while True:
                if stop.is_set():
                    child_stop.set()
                if not events.poll(poll_s):
                    continue
                try:
                    kind, payload = events.recv()
                except EOFError:
                    child.join(timeout=10)
                    raise SweepProcessFailed(
                        f"sweep failed: the sweep process ended without a result "
                        f"(exit code {child.exitcode})") from None
                if kind == "level":
                    on_level(payload)
                elif kind == "failed":
                    raise SweepProcessFailed(payload)
                else:
                    return
        finally:
            events.close()
            child.join(timeout=10)
            if child.is_alive():
                child.kill()
                child.join()
    return run


def sweep_spec_plan(spec: FleetSpec, plan: SweepPlan, topologies: Sequence[str], n_boot: int,
                    out_dir: Path, on_level: Callable[[LevelDone], None], stop: threading.Event,
                    adaptive: AdaptivePlan | None = None) -> Any:
    """run_sweep in the SweepFunction shape; module-level so that a partial of it pickles."""
    return run_sweep(spec, plan, out_dir, topologies, on_level=on_level, stop=stop, n_boot=n_boot,
                     adaptive=adaptive)


def jobs_in(plan_levels: Sequence[float], topologies: Sequence[str]) -> int:
    """How many (topology, level) jobs a sweep runs: on_level is called once after each."""
    return len(plan_levels) * max(1, len(topologies))
