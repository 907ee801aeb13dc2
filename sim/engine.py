"""The live engine: one instance's scheduler driven on the monotonic clock (the event loop's own
under asyncio; uvloop's loop.time() is the same clock in whole milliseconds, so it is not read here).

Each step is planned, its chunks formatted, and handed to the emitter thread (sim/emitter.py), which
writes them at the step's modelled end whatever the loop is doing; a timer at that end then applies
the step (no per-token task wake-ups, no task at all: that is what lets one process stream tens of
thousands of tokens a second). Without the thread the timer's callback writes the step's tokens itself,
in one synchronous pass. Steps are chained on their scheduled end times, so the served cadence follows
the model even when the loop wakes a little late.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from typing import Protocol

from crossover.sim import emitter as emitters
from crossover.sim.metrics import InstanceMetrics, QueueState
from crossover.sim.model import PerfModel
from crossover.sim.scheduler import Scheduler, SimRequest, StepOutcome, StepPlan

# Steps are chained on scheduled ends, so a late wake-up (a burst of arrivals, a collector pause) is
# caught up and the instance keeps its own cadence and phase. Only after a stall longer than this (s)
# does the chain skip ahead, by whole steps of the last step's length: restarting every instance "now"
# after a shared stall would phase-lock them all, piling every instance's writes onto the same instant
# from then on (seen after a 0.6 s stall of the machine: p50 from 1 ms to 12 ms for the rest of a run).
_MAX_CATCH_UP_S = 0.25
GAP_RING = 65536  # a power of two: the hot path masks instead of dividing
# epoll waits in whole milliseconds, rounded up, so a timer fires 0-1 ms late; aiming half a
# millisecond early centres the emission error on zero instead of on +0.5 ms.
_TIMER_LEAD_S = 0.0005
# A step's tokens are written one socket write after another (one per stream, ~5 us each, mostly the
# kernel's loopback send), so a step of 250 streams takes over a millisecond to emit. The pass starts
# half its expected length before the step's end, centring the writes on the scheduled emission
# instead of trailing it; the expected length is a running mean of the measured cost per write.
_WRITE_COST_S = 5e-6  # the first estimate of one token's write, seconds
_WRITE_COST_WEIGHT = 0.05  # weight of each step's measurement in the running mean
_MAX_LEAD_S = 0.005
# Bursts further than this from their step's end are not worth keeping apart (a stall is under way).
_MAX_SHIFT_S = 0.010
# The emitter thread's bursts are booked this much longer than their running-mean length: on a busy
# machine a burst's sends slow down, and the next burst would start behind it.
_THREAD_BURST_MARGIN = 1.25


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


class TokenSink(Protocol):
    """Whoever waits for a request's tokens (an HTTP handler); called on the engine's step pass."""

    def prepare(self, request: SimRequest, index: int, finishing: bool) -> int:
        """Format token `index` (1-based) into request.pending while the step that produces it is
        still running; returns the descriptor the emitter thread is to write it to, or -1 when
        on_token writes it from the loop."""

    def on_emitted(self, chunk: bytes, written_at: float, sent: int, step_end: float) -> None:
        """How the emitter thread's write of `chunk` went: bytes sent (or -errno) and when."""

    def on_token(self, request: SimRequest, step_end: float) -> None: ...

    def on_finish(self, request: SimRequest) -> None: ...


class LiveEngine:
    """One simulated vLLM engine core: scheduler + metrics + the step loop task."""

    def __init__(self, model: PerfModel, metrics: InstanceMetrics, time_scale: float = 1.0,
                 threaded_emitter: bool | None = None, realtime_emitter: bool = True) -> None:
        """threaded_emitter: streamed tokens are written by the emitter thread (default: when it is
        built), else from this event loop; realtime_emitter: the thread asks for SCHED_FIFO
        (sim/emitter.py)."""
        self.use_emitter = emitters.available() if threaded_emitter is None else threaded_emitter
        self.realtime_emitter = realtime_emitter
        self.emitter: emitters.LoopEmitter | None = None
        self.model = model
        self.metrics = metrics
        self.time_scale = time_scale
        self.slowdown = 1.0
        self.scheduler = Scheduler(model)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.Handle | None = None  # the pending timer or callback of the step chain
        self._plan: StepPlan | None = None  # the step in flight (its chunks formatted) and its end
        self._end = 0.0
        self._next_start = 0.0
        self._period = 0.0  # the last step's length (s)
        self._idle = False
        self._stopped = True
        self.write_cost = _WRITE_COST_S  # running mean of one token's write (seconds), see _due
        self.thread_write_cost = _WRITE_COST_S  # the same for the emitter thread's writes
        self._loop_writes = 0  # tokens of the step in flight that on_token writes from the loop
        self._last_burst = 0.0  # when the emitter thread's last burst of this instance starts
        self._book = WriteBook()
        # Emission gaps |actual write time - scheduled step end|, a ring the benchmark reads.
        self.emission_gaps = array("d", bytes(8 * GAP_RING))
        self.emission_count = 0

    def queue_state(self) -> QueueState:
        s = self.scheduler
        return QueueState(s.num_running, len(s.waiting), len(s.transferring), s.kv_usage, s.preemptions)

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._book = _BOOKS.setdefault(id(self._loop), WriteBook())
        if self.use_emitter and self.emitter is None:
            self.emitter = emitters.acquire(self._loop, self.realtime_emitter)
        self._stopped = False
        self._next_start = time.monotonic()
        self._handle = self._loop.call_soon(self._arm)

    async def stop(self) -> None:
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._plan = None
        if self.emitter is not None:
            emitter, self.emitter = self.emitter, None
            emitters.release(emitter)

    def submit(self, request: SimRequest) -> None:
        self.scheduler.add(request)
        if self._idle:
            self._wake_up()

    def _wake_up(self) -> None:
        """Leave the idle state: plan a step now (a new request, or KV that has arrived)."""
        if self._stopped or self._loop is None:
            return
        self._idle = False
        if self._handle is not None:
            self._handle.cancel()
        self._next_start = time.monotonic()
        self._handle = self._loop.call_soon(self._arm)

    def abort(self, request: SimRequest) -> None:
        self.scheduler.abort(request)

    def reset(self) -> list[SimRequest]:
        """A restart: drop every request (returned so their clients can be cut off) and the KV."""
        s = self.scheduler
        dropped = [*s.running, *s.transferring, *s.waiting]
        for request in dropped:
            request.finished = True
        self.scheduler = Scheduler(self.model)
        return dropped

    def _arm(self, from_due: bool = False) -> None:
        """Plan the step that starts at the previous one's scheduled end, format its chunks, and set a
        timer for its end; with nothing to run, go idle until a request (or in-flight KV) arrives.
        from_due: called by _due itself, so a step already due is queued, not recursed into."""
        self._handle = None
        loop = self._loop
        if self._stopped or loop is None:
            return
        now = time.monotonic()
        next_start = self._next_start
        start = next_start
        if now - next_start >= _MAX_CATCH_UP_S:
            period = self._period
            start = next_start + math.ceil((now - next_start) / period) * period if period > 0 else now
        plan = self.scheduler.plan(start)
        if plan is None:
            self._idle = True
            ready = self.scheduler.next_kv_ready()
            if ready is not None:
                self._handle = loop.call_at(max(ready, now), self._wake_up)
            return
        end = start + plan.seconds * self.slowdown / self.time_scale
        self._period = end - start
        emitting, sinks, fds, chunks = self._prepare(plan)
        self._plan = plan
        self._end = end
        self._loop_writes = emitting
        now = time.monotonic()
        if fds and self.emitter is not None:
            length = min(self.thread_write_cost * len(fds) * _THREAD_BURST_MARGIN, 2 * _MAX_LEAD_S)
            self.emitter.submit(self._thread_burst_start(end, length, now), self, end, sinks, fds, chunks)
        fire = end  # the step's bookkeeping; its tokens are the thread's unless some are the loop's
        if emitting:
            length = min(self.write_cost * emitting, 2 * _MAX_LEAD_S)
            fire = self._book.place(end, length, now) - _TIMER_LEAD_S
        if fire > now:
            self._handle = loop.call_at(fire, self._due)
        elif from_due:
            self._handle = loop.call_soon(self._due)
        else:
            self._due()

    def _due(self) -> None:
        """The step's end. When the loop writes tokens they are written in this callback, and
        planning the next step waits for a fresh callback, so that the writes of other instances'
        steps that fell due at the same time go first (each step's writes are what its clients time).
        When the emitter thread writes them, the next step is planned and handed over right here, in
        the timer's callback: a fresh callback would queue behind the I/O of that loop iteration (a
        wave of new requests held hand-overs 40-60 ms, past their bursts)."""
        self._handle = None
        plan, end, loop = self._plan, self._end, self._loop
        self._plan = None
        if plan is None or loop is None or self._stopped:
            return
        outcome = self.scheduler.complete(plan, end)
        self._next_start = end
        threaded = not self._loop_writes  # nothing for the loop to write at this step's end
        if not threaded:
            self._handle = loop.call_soon(self._arm)
        emitted = outcome.emitted
        if emitted:
            began = time.monotonic()
            for request in emitted:
                if request.sink is not None:
                    request.sink.on_token(request, end)
            if self._loop_writes:
                cost = (time.monotonic() - began) / self._loop_writes
                self.write_cost += _WRITE_COST_WEIGHT * (cost - self.write_cost)
        self._account(outcome, end)
        if threaded:
            self._arm(from_due=True)

    def _thread_burst_start(self, end: float, length: float, now: float) -> float:
        """Where the emitter thread's burst for a step ending at `end` starts: the booked place, but
        never before this instance's previous burst. The thread writes batches by start time and a
        stream's tokens must leave in order; the book alone only keeps bursts from overlapping. A
        start already past (the loop planned the step late) is written at once, and counted late."""
        begin = max(self._book.place(end, length, now), self._last_burst)
        self._last_burst = begin
        return begin

    def note_burst(self, writes: int, seconds: float) -> None:
        """The emitter thread wrote `writes` chunks of one step in `seconds` (first to last)."""
        cost = seconds / (writes - 1)
        self.thread_write_cost += _WRITE_COST_WEIGHT * (cost - self.thread_write_cost)

    @staticmethod
    def _prepare(plan: StepPlan) -> tuple[int, list[TokenSink], list[int], list[bytes]]:
        """Format every chunk this step will emit before it ends, so that at the step's end only the
        socket writes remain between the scheduled and the actual emission. Returns how many the loop
        writes, and the (sink, descriptor, chunk) lists of those the emitter thread writes."""
        emitting = 0
        sinks: list[TokenSink] = []
        fds: list[int] = []
        chunks: list[bytes] = []
        for request, tokens in plan.work:
            sink = request.sink
            if sink is None or request.computed + tokens < request.prefill_target:
                continue  # a prefill chunk that does not finish the prompt emits nothing
            index = request.generated + 1
            fd = sink.prepare(request, index, index >= request.output_tokens)
            if fd < 0:
                emitting += 1
            else:
                sinks.append(sink)
                fds.append(fd)
                chunks.append(request.pending)
                request.pending = b""
        return emitting, sinks, fds, chunks

    def _account(self, outcome: StepOutcome, end: float) -> None:
        """A step's bookkeeping, after its writes (they are what clients time): metrics, finished
        requests' handlers."""
        metrics = self.metrics
        itl = metrics.itl
        for request in outcome.emitted:
            if request.prev_token_time is None:
                metrics.ttft.observe(end - request.arrival)
                metrics.on_prompt(request.prompt_tokens, request.cached_tokens,
                                  request.prompt_tokens - 1 if request.remote_kv else 0)
                if request.remote_kv:
                    metrics.on_kv_transfer(request.kv_transfer_s, self.model.kv_transfer_bytes(
                        request.prompt_tokens), self.model.blocks_for(request.prompt_tokens))
            else:
                itl.observe(end - request.prev_token_time)
        metrics.generation_tokens += len(outcome.emitted)
        for request in outcome.finished:
            metrics.on_finished(
                reason=request.finish_reason, arrival=request.arrival,
                scheduled=request.scheduled_time if request.scheduled_time is not None else request.arrival,
                first_token=request.first_token_time or end, last_token=end,
                prompt_tokens=request.prompt_tokens, generated=request.generated)
            if request.sink is not None:
                request.sink.on_finish(request)

