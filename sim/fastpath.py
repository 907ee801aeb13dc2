"""The simulator's token emitter thread (sim/_emitter.c), plugged in at start as a write path
(sim/writer.py's WritePath): FastPath, which `crossover sim` (sim/fleet.py) starts with.

A streaming request's chunks are handed over when its step is planned and written by the thread at
the step's scheduled end, so the event loop's own load (new requests, planning, /metrics, collector
pauses) does not delay them; the loop learns how each write went through an eventfd and does the
bookkeeping there (token times, emission gaps, the rare short write, which the stream's transport
then finishes). One emitter per event loop of a FastPath, shared by every instance on it (their
bursts are placed apart by the loop's WriteBook), started by the first engine's writer and stopped
with the last. Each stream the thread writes to holds a duplicate of its socket's descriptor
(ThreadOutput), closed only once no handed-over chunk is left, so its number is never reused under a
pending write. Without the compiled module (a source install with no compiler) the loop writes
instead (`crossover sim --emitter loop`).

The collector policy that goes with it (`--gc`) is sim/gcpolicy.py's CollectorPolicy; FastPath only
reports its pauses in /admin/stats beside the emitter's counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from crossover.sim.writer import (
    MAX_LEAD_S,
    WRITE_COST_S,
    WRITE_COST_WEIGHT,
    StepWriter,
    StreamOutput,
    TransportOutput,
    WriteBook,
    WritePath,
    Written,
    book_for,
)

if TYPE_CHECKING:
    from crossover.sim.engine import LiveEngine
    from crossover.sim.gcpolicy import CollectorPolicy
    from crossover.sim.scheduler import SimRequest

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
    writer: ThreadWriter
    start: float
    submitted: float
    step_end: float
    outputs: Sequence[ThreadOutput]
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

    def submit(self, start: float, writer: ThreadWriter, step_end: float, outputs: Sequence[ThreadOutput],
               fds: list[int], chunks: list[bytes]) -> None:
        """Write chunks[i] to fds[i] from `start` on (monotonic seconds), in order."""
        now = time.monotonic()
        if now > start:
            self.stats.late_submissions += 1
            self.stats.late_submission_max_s = max(self.stats.late_submission_max_s, now - start)
        batch_id = self._native.submit(start, fds, chunks)
        self._batches[batch_id] = _Batch(writer, start, now, step_end, outputs, chunks)

    def drain(self) -> None:
        """Report every written batch to its outputs (the eventfd's reader; also called by an output
        that must know its earlier chunks are out before it writes through its transport)."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self._eventfd)
        for batch_id, times, sent, woke in self._native.collect():
            batch = self._batches.pop(batch_id)
            step_end = batch.step_end
            for output, chunk, at, count in zip(batch.outputs, batch.chunks, times, sent, strict=True):
                output.on_emitted(chunk, at, count, step_end)
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
                batch.writer.note_burst(len(times), times[-1] - times[0])

    def release(self, fd: int) -> None:
        """Forget fd's short writes: before it is closed (its number may come back)."""
        self._native.release(fd)

    def close(self) -> None:
        """Stop the thread; the batches it had not written yet are reported as cancelled, so their
        outputs settle (and close their descriptors)."""
        self.drain()
        self.loop.remove_reader(self._eventfd)
        self._native.close()
        os.close(self._eventfd)
        batches, self._batches = self._batches, {}
        now = time.monotonic()
        for batch in batches.values():
            for output, chunk in zip(batch.outputs, batch.chunks, strict=True):
                output.on_emitted(chunk, now, -errno.ECANCELED, batch.step_end)


# --- the plug-in ---------------------------------------------------------------------------------

_THREAD_BURST_MARGIN = 1.25
"""The emitter thread's bursts are booked this much longer than their running-mean length: on a
busy machine a burst's sends slow down, and the next burst would start behind it."""


class ThreadOutput:
    """A stream the emitter thread may write to: a duplicate of its socket for the thread, the chunks
    handed over and not reported yet, and the loop's chunks held behind them (a stream's tokens leave
    in order). A short write (the client stopped reading) moves the rest of the stream to the
    transport, which buffers it, in order."""

    __slots__ = ("closed", "emitter", "fd", "flushed", "held", "inflight", "sink", "sock", "threaded",
                 "transport")

    def __init__(self, emitter: LoopEmitter, transport: asyncio.Transport, sink: Written) -> None:
        self.emitter = emitter
        self.transport = transport
        self.sink = sink
        self.inflight = 0  # chunks handed to the thread and not reported yet
        self.held: list[tuple[bytes, float]] = []  # loop-written chunks (and their steps' ends) waiting
        self.flushed: list[Callable[[], None]] = []
        self.closed = False
        self.sock: socket.socket | None = None
        # a stream whose headers are still buffered in the transport stays on the loop (the
        # thread's writes would overtake them)
        raw = transport.get_extra_info("socket")
        if raw is not None and transport.get_write_buffer_size() == 0:
            with contextlib.suppress(OSError):  # out of descriptors: this stream stays on the loop
                self.sock = socket.socket(fileno=os.dup(raw.fileno()))
        self.fd = self.sock.fileno() if self.sock is not None else -1
        # the thread may write this stream's next chunk (until a write of its falls short, or the
        # duplicate is closed)
        self.threaded = self.sock is not None

    def closing(self) -> bool:
        return self.transport.is_closing()

    def write(self, chunk: bytes, step_end: float) -> None:
        if self.inflight:  # earlier chunks are still the thread's: they go first
            self.emitter.drain()
            if self.inflight:
                self.held.append((chunk, step_end))
                return
        self.transport.write(chunk)
        self.sink.written(time.monotonic(), step_end)

    def on_emitted(self, chunk: bytes, written_at: float, sent: int, step_end: float) -> None:
        """How the thread's write of `chunk` went: bytes sent (or -errno) and when."""
        self.inflight -= 1
        if sent == len(chunk):
            self.sink.written(written_at, step_end)
        elif sent >= 0 or sent == -errno.EAGAIN:
            self.threaded = False
            if not self.transport.is_closing():
                self.transport.write(chunk[max(sent, 0):])
            self.sink.written(time.monotonic(), step_end)
        else:  # the connection is gone (or the emitter stopped before writing)
            self.threaded = False
            self.sink.lost()
        if self.inflight == 0:
            held, self.held = self.held, []
            for later, its_end in held:
                if not self.transport.is_closing():
                    self.transport.write(later)
                self.sink.written(time.monotonic(), its_end)
            flushed, self.flushed = self.flushed, []
            for callback in flushed:
                callback()
            if self.closed:
                self._close_socket()

    def when_flushed(self, callback: Callable[[], None]) -> None:
        if self.inflight or self.held:
            self.flushed.append(callback)
        else:
            callback()

    def cut(self) -> None:
        self.transport.abort()
        if self.sock is not None:  # the duplicate would keep the connection open
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.closed = True
        if self.inflight == 0:
            self._close_socket()

    def _close_socket(self) -> None:
        sock, self.sock = self.sock, None
        self.threaded = False
        if sock is not None:
            self.emitter.release(sock.fileno())  # its short writes forgotten before its number comes back
            sock.close()


class ThreadWriter(StepWriter):
    """Hands each step's chunks of threaded streams to the emitter thread when the step is planned,
    booked at the step's end; the loop writes the rest (StepWriter)."""

    def __init__(self, book: WriteBook, emitter: LoopEmitter, on_close: Callable[[], None]) -> None:
        """on_close: called once the engine is done with the writer (its FastPath releases the emitter)."""
        super().__init__(book)
        self.emitter = emitter
        self.on_close = on_close
        self.thread_write_cost = WRITE_COST_S  # running mean of one of the thread's writes
        self._last_burst = 0.0  # when this engine's last burst starts

    def hand_over(self, end: float, now: float, requests: Sequence[SimRequest]) -> int:
        outputs: list[ThreadOutput] = []
        fds: list[int] = []
        chunks: list[bytes] = []
        emitter = self.emitter
        for request in requests:  # the hot path: one token of every stream, every step
            output = request.sink.output
            if output.__class__ is ThreadOutput and output.threaded and output.emitter is emitter:
                output.inflight += 1
                outputs.append(output)
                fds.append(output.fd)
                chunks.append(request.pending)
                request.pending = b""
        if fds:
            length = min(self.thread_write_cost * len(fds) * _THREAD_BURST_MARGIN, 2 * MAX_LEAD_S)
            self.emitter.submit(self.burst_start(end, length, now), self, end, outputs, fds, chunks)
        return len(fds)

    def burst_start(self, end: float, length: float, now: float) -> float:
        """Where the thread's burst for a step ending at `end` starts: the booked place, but never
        before this engine's previous burst. The thread writes batches by start time and a stream's
        tokens must leave in order; the book alone only keeps bursts from overlapping. A start
        already past (the loop planned the step late) is written at once, and counted late."""
        begin = max(self.book.place(end, length, now), self._last_burst)
        self._last_burst = begin
        return begin

    def note_burst(self, writes: int, seconds: float) -> None:
        """The thread wrote `writes` chunks of one step in `seconds` (first to last)."""
        cost = seconds / (writes - 1)
        self.thread_write_cost += WRITE_COST_WEIGHT * (cost - self.thread_write_cost)

    def close(self) -> None:
        self.on_close()


class FastPath(WritePath):
    """The plug-in: streamed tokens written by the emitter thread (threaded; realtime asks for
    SCHED_FIFO), one emitter per event loop its engines run on; /admin/stats gets the emitter's
    counters and, with a `collector` (sim/gcpolicy.py, started and stopped by its owner), its pauses."""

    def __init__(self, threaded: bool, realtime: bool = True,
                 collector: CollectorPolicy | None = None) -> None:
        self.threaded = threaded
        self.realtime = realtime
        self.collector = collector
        self._emitters: dict[asyncio.AbstractEventLoop, LoopEmitter] = {}

    def writer(self, engine: LiveEngine) -> StepWriter:
        loop = asyncio.get_running_loop()
        if not self.threaded:
            return StepWriter(book_for(loop))
        emitter = self._emitters.get(loop)
        if emitter is None:  # the loop's first engine starts it, with this path's priority
            emitter = self._emitters[loop] = LoopEmitter(loop, self.realtime)
        emitter.users += 1
        return ThreadWriter(book_for(loop), emitter, partial(self._release, emitter))

    def _release(self, emitter: LoopEmitter) -> None:
        """An engine is done with its writer: the loop's last one stops the emitter."""
        emitter.users -= 1
        if emitter.users <= 0:
            emitter.close()
            if self._emitters.get(emitter.loop) is emitter:
                del self._emitters[emitter.loop]

    def output(self, transport: asyncio.Transport, sink: Written, *, on_loop: bool) -> StreamOutput:
        emitter = self._emitters.get(asyncio.get_running_loop()) if self.threaded and not on_loop else None
        if emitter is None:
            return TransportOutput(transport, sink)
        return ThreadOutput(emitter, transport, sink)

    def stats(self, reset: bool) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.collector is not None:  # process-wide: every instance reports the same
            out["gc"] = self.collector.stats(reset)
        emitter = self._emitters.get(asyncio.get_running_loop())
        if emitter is not None:  # shared by the loop's instances, like the collector
            out["emitter"] = {"priority": emitter.priority, **dataclasses.asdict(emitter.stats)}
            if reset:
                emitter.stats = EmitterStats()
        return out
