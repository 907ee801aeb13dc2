"""The token emitter thread (sim/_emitter.c) as the event loop sees it.

A streaming request's chunks are handed over when its step is planned and written by the thread at
the step's scheduled end, so the event loop's own load (new requests, planning, /metrics) no longer
delays them; the loop learns how each write went through an eventfd and does the bookkeeping there
(token times, emission gaps, the rare short write, which the stream's transport then finishes).

One emitter per event loop, shared by every instance on it (their bursts are placed apart by the
engine's WriteBook). Without the compiled module (a source install with no compiler) the engine
writes from the loop instead (`crossover sim --emitter loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crossover.sim.engine import LiveEngine, TokenSink

try:
    from crossover.sim._emitter import Emitter as _NativeEmitter
except ImportError:  # pragma: no cover - exercised by installs without a compiler
    _NativeEmitter = None

MODES = ("auto", "thread", "loop")
PRIORITIES = ("realtime", "normal")


def available() -> bool:
    return _NativeEmitter is not None


def threaded(mode: str) -> bool:
    """Whether streamed tokens are written by the emitter thread: "thread", "loop", or "auto" (the
    thread when it is built)."""
    if mode not in MODES:
        raise ValueError(f"must be one of {', '.join(MODES)}, not {mode!r}")
    if mode == "thread" and not available():
        raise ValueError("thread: the emitter module crossover.sim._emitter is not built "
                         "(reinstall the package where a C compiler is available)")
    return mode != "loop" and available()


@dataclass(slots=True)
class _Batch:
    engine: LiveEngine
    start: float
    submitted: float
    step_end: float
    sinks: Sequence[TokenSink]
    chunks: list[bytes]


@dataclass(slots=True)
class EmitterStats:
    """Where emission delay comes from, for /admin/stats: batches handed over after their start (the
    event loop was late planning the step), and the thread's lateness at each batch's first write."""

    batches: int = 0
    late_submissions: int = 0
    late_submission_max_s: float = 0.0
    first_write_late_max_s: float = 0.0
    # Batches whose first write came more than a millisecond late: behind the previous batch's last
    # write (bursts ran longer than booked), the thread woken late (it waited for a core), or the
    # first send() itself slow (the kernel: a socket lock the client holds, say).
    late_behind_previous: int = 0
    late_on_its_own: int = 0
    late_in_first_send: int = 0


class LoopEmitter:
    """The emitter thread of one event loop, and the batches it has not reported yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop, realtime: bool = True) -> None:
        """realtime: ask for SCHED_FIFO for the thread (granted where the process may; `priority`
        says what it got)."""
        if _NativeEmitter is None:
            raise RuntimeError("the simulator's emitter module (crossover.sim._emitter) is not built")
        self.loop = loop
        self.users = 0
        self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._native: Any = _NativeEmitter(self._eventfd, realtime)
        self.priority: str = self._native.priority
        self._batches: dict[int, _Batch] = {}
        self.stats = EmitterStats()
        self._last_write = 0.0  # the previous batch's last write
        loop.add_reader(self._eventfd, self.drain)

    def submit(self, start: float, engine: LiveEngine, step_end: float, sinks: Sequence[TokenSink],
               fds: list[int], chunks: list[bytes]) -> None:
        """Write chunks[i] to fds[i] from `start` on (monotonic seconds), in order."""
        now = time.monotonic()
        if now > start:
            self.stats.late_submissions += 1
            self.stats.late_submission_max_s = max(self.stats.late_submission_max_s, now - start)
        batch_id = self._native.submit(start, fds, chunks)
        self._batches[batch_id] = _Batch(engine, start, now, step_end, sinks, chunks)

    def drain(self) -> None:
        """Report every written batch to its sinks (the eventfd's reader; also called by a sink that
        must know its earlier chunks are out before it writes through its transport)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._eventfd)
        for batch_id, times, sent, woke in self._native.collect():
            batch = self._batches.pop(batch_id)
            step_end = batch.step_end
            for sink, chunk, written_at, count in zip(batch.sinks, batch.chunks, times, sent, strict=True):
                sink.on_emitted(chunk, written_at, count, step_end)
            stats = self.stats
            stats.batches += 1
            if times:
                # How late the thread's first write was: the thread's own wake-up and any earlier
                # batch still being written (the submission's own lateness is counted apart).
                due = max(batch.start, batch.submitted)
                late = times[0] - due
                stats.first_write_late_max_s = max(stats.first_write_late_max_s, late)
                if late > 0.001:
                    if self._last_write > due:
                        stats.late_behind_previous += 1
                    elif woke - due > 0.001:
                        stats.late_on_its_own += 1
                    else:
                        stats.late_in_first_send += 1
                self._last_write = times[-1]
            if len(times) > 1:
                batch.engine.note_burst(len(times), times[-1] - times[0])

    def release(self, fd: int) -> None:
        """Forget fd's short writes: before it is closed (its number may come back)."""
        self._native.release(fd)

    def close(self) -> None:
        """Stop the thread; the batches it had not written yet are reported as cancelled, so their
        sinks settle (and close their descriptors)."""
        self.drain()
        self.loop.remove_reader(self._eventfd)
        self._native.close()
        os.close(self._eventfd)
        batches, self._batches = self._batches, {}
        now = time.monotonic()
        for batch in batches.values():
            for sink, chunk in zip(batch.sinks, batch.chunks, strict=True):
                sink.on_emitted(chunk, now, -errno.ECANCELED, batch.step_end)


_EMITTERS: dict[int, LoopEmitter] = {}  # by id(event loop)


def acquire(loop: asyncio.AbstractEventLoop, realtime: bool = True) -> LoopEmitter:
    """The loop's emitter (started by its first user, whose `realtime` counts)."""
    emitter = _EMITTERS.get(id(loop))
    if emitter is None or emitter.loop is not loop:
        emitter = _EMITTERS[id(loop)] = LoopEmitter(loop, realtime)
    emitter.users += 1
    return emitter


def release(emitter: LoopEmitter) -> None:
    emitter.users -= 1
    if emitter.users <= 0:
        emitter.close()
        if _EMITTERS.get(id(emitter.loop)) is emitter:
            del _EMITTERS[id(emitter.loop)]
