r"""The background sweep: one thread per sweep, owned by a runner the page keeps between reruns.

The page never waits on the sweep. It calls `start` and `stop` and reads `status()`, a plain
snapshot taken under a lock; everything the sweep reports arrives through `on_level`. The runner
is a small state machine:

    idle --start--> running --(last level)--> finished
                      |  \--(error)---------> failed
                      \--stop--> stopping --> stopped
    finished / failed / stopped --start--> running
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

import pandas as pd

from crossover.errors import UserError
from crossover.loadgen.sweep import LevelDone


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
    axis: str = "concurrency"  # the plan's load axis: "concurrency" or "rate"
    started_at: float | None = None
    ended_at: float | None = None
    levels_done: int = 0
    levels_total: int = 0
    marks: tuple[LevelMark, ...] = ()
    error: str | None = None
    generation: int = 0  # grows with every start and every finished level: a cache key for results
    summary: pd.DataFrame | None = None  # per topology x level, as of the last finished level
    crossover: dict[str, Any] = field(default_factory=dict)  # loadgen's analyze() as of then
    request_frames: tuple[pd.DataFrame, ...] = ()  # each finished level's requests

    def requests(self) -> pd.DataFrame:
        return pd.concat(self.request_frames, ignore_index=True) if self.request_frames else pd.DataFrame()

    @property
    def progress(self) -> float:
        return min(1.0, self.levels_done / self.levels_total) if self.levels_total else 0.0


# (out_dir, on_level, stop) -> anything: crossover.loadgen.sweep.run_sweep with the spec, plan and
# topologies bound; it writes its results under out_dir and calls on_level after every level.
SweepFunction = Callable[[Path, Callable[[LevelDone], None], threading.Event], Any]


def describe_failure(exc: BaseException) -> str:
    """One readable line for any exception: the user's mistake as-is, anything else named."""
    if isinstance(exc, UserError):
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
              axis: str = "concurrency") -> None:
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
        with self._lock:
            if error is not None:
                state = RunState.FAILED
            elif stop.is_set():
                state = RunState.STOPPED
            else:
                state = RunState.FINISHED
            self._status = replace(self._status, state=state, error=error, ended_at=time.time(),
                                   generation=self._status.generation + 1)


def jobs_in(plan_levels: Sequence[float], topologies: Sequence[str]) -> int:
    """How many (topology, level) jobs a sweep runs: on_level is called once after each."""
    return len(plan_levels) * max(1, len(topologies))
