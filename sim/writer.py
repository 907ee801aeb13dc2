"""The simulator's write path as the engine and the server see it, and its plain default.

A step's tokens are formatted while the step runs and written at its modelled end (sim/engine.py).
Two things decide how: the engine's StepWriter (when its step-end callback fires, and which chunks
someone other than the loop takes over beforehand) and each stream's StreamOutput (how a chunk
reaches the stream's connection, and when it is out). The defaults here write from the event loop
through the stream's transport; sim/fastpath.py plugs in the emitter thread at start (and reports
the collector policy of sim/gcpolicy.py). Neither the engine nor the server knows which one runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from crossover.sim.engine import LiveEngine
    from crossover.sim.scheduler import SimRequest

# epoll waits in whole milliseconds, rounded up, so a timer fires 0-1 ms late; aiming half a
# millisecond early centres the emission error on zero instead of on +0.5 ms.
TIMER_LEAD_S = 0.0005
# A step's tokens are written one socket write after another (one per stream, ~5 us each, mostly the
# kernel's loopback send), so a step of 250 streams takes over a millisecond to emit. The writes start
# half their expected length before the step's end, centring them on the scheduled emission instead
# of trailing it; the expected length is a running mean of the measured cost per write.
WRITE_COST_S = 5e-6  # the first estimate of one token's write, seconds
WRITE_COST_WEIGHT = 0.05  # weight of each step's measurement in the running mean
MAX_LEAD_S = 0.005
# Bursts further than this from their step's end are not worth keeping apart (a stall is under way).
_MAX_SHIFT_S = 0.010


class WriteBook:
    """The write bursts planned on one event loop (every instance of a fleet shares it): a step's burst
    is placed where it overlaps no other, as close to its step's end as that allows. Two instances
    whose steps end together would otherwise write one after the other, the second's tokens all late
    by the first's burst; placed side by side around the shared end, each is off by half as much."""

    __slots__ = ("bursts",)

    def __init__(self) -> None:
        self.bursts: list[tuple[float, float]] = []  # (first write, last write), expected

    def place(self, end: float, length: float, now: float) -> float:
        """Book a burst of `length` seconds of writes for tokens due at `end`; returns its start."""
        bursts = [b for b in self.bursts if b[1] > now]
        ideal = end - length / 2
        best, worst = ideal, length / 2
        if any(a < ideal + length and ideal < b for a, b in bursts):
            best, worst = ideal, _MAX_SHIFT_S
            for a, b in bursts:
                for start in (a - length, b):
                    off = max(end - start, start + length - end)
                    if off < worst and start >= now and \
                            not any(x < start + length and start < y for x, y in bursts):
                        best, worst = start, off
        bursts.append((best, best + length))
        self.bursts = bursts
        return best


_BOOKS: dict[int, WriteBook] = {}  # by id(event loop)


def book_for(loop: asyncio.AbstractEventLoop) -> WriteBook:
    return _BOOKS.setdefault(id(loop), WriteBook())


class Written(Protocol):
    """What a stream's output reports to its sink (the server's, which records token times)."""

    def written(self, at: float, step_end: float) -> None:
        """A chunk of the step ending at `step_end` left at `at` (monotonic seconds)."""

    def lost(self) -> None:
        """The connection is gone: nothing more will be written."""


class StreamOutput(Protocol):
    """One stream's connection, as its sink writes to it."""

    def closing(self) -> bool: ...

    def write(self, chunk: bytes, step_end: float) -> None:
        """On the loop at the step's end: write `chunk` after whatever was taken over earlier."""

    def when_flushed(self, callback: Callable[[], None]) -> None:
        """Call `callback` once every chunk taken so far is out (at once when none is pending)."""

    def cut(self) -> None:
        """Drop the connection now."""

    def close(self) -> None:
        """The stream is over: release what the output holds once its chunks are out."""


class TransportOutput:
    """The default output: each chunk written through the stream's transport when it is due."""

    __slots__ = ("sink", "transport")

    def __init__(self, transport: asyncio.Transport, sink: Written) -> None:
        self.transport = transport
        self.sink = sink

    def closing(self) -> bool:
        return self.transport.is_closing()

    def write(self, chunk: bytes, step_end: float) -> None:
        self.transport.write(chunk)
        self.sink.written(time.monotonic(), step_end)

    def when_flushed(self, callback: Callable[[], None]) -> None:
        callback()

    def cut(self) -> None:
        self.transport.abort()

    def close(self) -> None:
        pass


class StepWriter:
    """The default step writer: the loop writes each step's tokens in the callback at its end, the
    burst booked apart from other instances' and centred on the end by its measured cost."""

    def __init__(self, book: WriteBook) -> None:
        self.book = book
        self.write_cost = WRITE_COST_S  # running mean of one token's write from the loop (seconds)

    def hand_over(self, end: float, now: float, requests: Sequence[SimRequest]) -> int:
        """Take over the formatted chunks (request.pending) that someone else writes at `end`;
        returns how many were taken. The loop writes all of them here."""
        return 0

    def fire_time(self, end: float, loop_writes: int, now: float) -> float:
        """When the engine's callback for a step ending at `end` runs: before the end by half the
        loop's burst (booked), or at the end when the loop has nothing to write."""
        if not loop_writes:
            return end
        length = min(self.write_cost * loop_writes, 2 * MAX_LEAD_S)
        return self.book.place(end, length, now) - TIMER_LEAD_S

    def wrote(self, writes: int, seconds: float) -> None:
        """The loop wrote `writes` chunks of one step in `seconds`."""
        if writes:
            self.write_cost += WRITE_COST_WEIGHT * (seconds / writes - self.write_cost)

    def close(self) -> None:
        pass


class WritePath:
    """What the simulator is started with (the default: the loop writes, the collector untouched):
    a step writer per engine, an output per stream, and what it has to say in /admin/stats."""

    def writer(self, engine: LiveEngine) -> StepWriter:
        """The step writer of an engine starting on the running loop."""
        return StepWriter(book_for(asyncio.get_running_loop()))

    def output(self, transport: asyncio.Transport, sink: Written, *, on_loop: bool) -> StreamOutput:
        """on_loop: the stream must be written from the loop (a fault cuts it there)."""
        return TransportOutput(transport, sink)

    def stats(self, reset: bool) -> dict[str, Any]:
        return {}
