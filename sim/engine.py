"""The live engine: one instance's scheduler driven on the monotonic clock (the event loop's own
under asyncio; uvloop's loop.time() is the same clock in whole milliseconds, so it is not read here).

Each step is planned and its chunks formatted by the requests' token sinks while it runs; at the
step's modelled end a timer applies the step and the sinks write their tokens, in one synchronous pass
(no per-token task wake-ups, no task at all: that is what lets one process stream tens of thousands
of tokens a second). Who writes when is the write path's (sim/writer.py): by default the timer's
callback, placed by the loop's write book; a plug-in (sim/fastpath.py) may take chunks over when the
step is planned. Steps are chained on their scheduled end times, so the served cadence follows the
model even when the loop wakes a little late.
"""

from __future__ import annotations

import asyncio
import math
import time
from array import array
from typing import Any, Protocol

from crossover.sim.metrics import InstanceMetrics, QueueState
from crossover.sim.model import PerfModel
from crossover.sim.scheduler import Scheduler, SimRequest, StepOutcome, StepPlan
from crossover.sim.writer import StepWriter, WritePath

# Steps are chained on scheduled ends, so a late wake-up (a burst of arrivals, a collector pause) is
# caught up and the instance keeps its own cadence and phase. Only after a stall longer than this (s)
# does the chain skip ahead, by whole steps of the last step's length: restarting every instance "now"
# after a shared stall would phase-lock them all, piling every instance's writes onto the same instant
# from then on (seen after a 0.6 s stall of the machine: p50 from 1 ms to 12 ms for the rest of a run).
_MAX_CATCH_UP_S = 0.25
GAP_RING = 65536  # a power of two: the hot path masks instead of dividing
class TokenSink(Protocol):
    """Whoever waits for a request's tokens (an HTTP handler); called on the engine's step pass.
    `output` is where its chunks go (sim/writer.py's StreamOutput), None when it writes none."""

    output: Any

    def prepare(self, request: SimRequest, index: int, finishing: bool) -> None:
        """Format token `index` (1-based) into request.pending while the step that produces it is
        still running (the write path may take it over from there)."""

    def on_token(self, request: SimRequest, step_end: float) -> None:
        """The step's end, on the loop: the token is out (write request.pending, if still there)."""

    def on_finish(self, request: SimRequest) -> None: ...


class LiveEngine:
    """One simulated vLLM engine core: scheduler + metrics + the step loop task."""

    def __init__(self, model: PerfModel, metrics: InstanceMetrics, time_scale: float = 1.0) -> None:
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
        self.writer: StepWriter | None = None  # the write path's, from start
        self._loop_writes = 0  # tokens of the step in flight that on_token writes from the loop
        self.cut_requests = 0  # requests dropped before their last token (aborted, or a restart)
        # Emission gaps |actual write time - scheduled step end|, a ring the benchmark reads.
        self.emission_gaps = array("d", bytes(8 * GAP_RING))
        self.emission_count = 0

    def queue_state(self) -> QueueState:
        s = self.scheduler
        return QueueState(s.num_running, len(s.waiting), len(s.transferring), s.kv_usage, s.preemptions)

    def start(self, path: WritePath) -> None:
        self._loop = asyncio.get_running_loop()
        if self.writer is None:
            self.writer = path.writer(self)
        self._stopped = False
        self._next_start = time.monotonic()
        self._handle = self._loop.call_soon(self._arm)

    async def stop(self) -> None:
        self._stopped = True
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._plan = None
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()

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
        if not request.finished:
            self.cut_requests += 1
        self.scheduler.abort(request)

    def reset(self) -> list[SimRequest]:
        """A restart: drop every request (returned so their clients can be cut off) and the KV."""
        s = self.scheduler
        dropped = [*s.running, *s.transferring, *s.waiting]
        for request in dropped:
            request.finished = True
        self.cut_requests += len(dropped)
        self.scheduler = Scheduler(self.model)
        return dropped

    def _arm(self, from_due: bool = False) -> None:
        """Plan the step that starts at the previous one's scheduled end, format its chunks, and set a
        timer for its end; with nothing to run, go idle until a request (or in-flight KV) arrives.
        from_due: called by _due itself, so a step already due is queued, not recursed into."""
        self._handle = None
        loop, writer = self._loop, self.writer
        if self._stopped or loop is None or writer is None:
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
        emitting = self._prepare(plan)
        self._plan = plan
        self._end = end
        now = time.monotonic()
        self._loop_writes = len(emitting) - writer.hand_over(end, now, emitting)
        fire = writer.fire_time(end, self._loop_writes, now)
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
        When the write path took them all over, the next step is planned and handed over right here,
        in the timer's callback: a fresh callback would queue behind the I/O of that loop iteration (a
        wave of new requests held hand-overs 40-60 ms, past their bursts)."""
        self._handle = None
        plan, end, loop, writer = self._plan, self._end, self._loop, self.writer
        self._plan = None
        if plan is None or loop is None or writer is None or self._stopped:
            return
        outcome = self.scheduler.complete(plan, end)
        self._next_start = end
        handed_over = not self._loop_writes  # nothing for the loop to write at this step's end
        if not handed_over:
            self._handle = loop.call_soon(self._arm)
        emitted = outcome.emitted
        if emitted:
            began = time.monotonic()
            for request in emitted:
                if request.sink is not None:
                    request.sink.on_token(request, end)
            writer.wrote(self._loop_writes, time.monotonic() - began)
        self._account(outcome, end)
        if handed_over:
            self._arm(from_due=True)

    @staticmethod
    def _prepare(plan: StepPlan) -> list[SimRequest]:
        """Format every chunk this step will emit before it ends, so that at the step's end only the
        socket writes remain between the scheduled and the actual emission; returns their requests."""
        emitting = []
        for request, tokens in plan.work:
            sink = request.sink
            if sink is None or request.computed + tokens < request.prefill_target:
                continue  # a prefill chunk that does not finish the prompt emits nothing
            index = request.generated + 1
            sink.prepare(request, index, index >= request.output_tokens)
            emitting.append(request)
        return emitting

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
                prompt_tokens=request.prompt_tokens, generated=request.generated,
                preemptions=request.preemptions)
            if request.sink is not None:
                request.sink.on_finish(request)

