"""The live engine: one instance's scheduler driven on the event loop's clock.

Each step is planned, slept through until its modelled end, then its tokens are handed to the
requests' sinks in one synchronous pass (no per-token task wake-ups: that is what lets one process
stream tens of thousands of tokens a second). Steps are chained on their scheduled end times, so
the served cadence follows the model even when the loop wakes a little late.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from array import array
from typing import Protocol

from crossover.sim.metrics import InstanceMetrics, QueueState
from crossover.sim.model import PerfModel
from crossover.sim.scheduler import Scheduler, SimRequest, StepOutcome, StepPlan

# Steps are chained on scheduled ends, so a late wake-up (a burst of arrivals, a collector pause) is
# caught up and the instance keeps its own cadence and phase. Only after a stall longer than this (s)
# does the chain restart from now: restarting every instance "now" after a shared stall would
# phase-lock them all, piling every instance's writes onto the same instant from then on.
_MAX_CATCH_UP_S = 0.25
GAP_RING = 65536  # a power of two: the hot path masks instead of dividing
# epoll waits in whole milliseconds, rounded up, so a timer fires 0-1 ms late; aiming half a
# millisecond early centres the emission error on zero instead of on +0.5 ms.
_TIMER_LEAD_S = 0.0005


class TokenSink(Protocol):
    """Whoever waits for a request's tokens (an HTTP handler); called on the engine's step pass."""

    def prepare(self, request: SimRequest, index: int, finishing: bool) -> None:
        """Format token `index` (1-based) while the step that produces it is still running."""

    def on_token(self, request: SimRequest, step_end: float) -> None: ...

    def on_finish(self, request: SimRequest) -> None: ...


class LiveEngine:
    """One simulated vLLM engine core: scheduler + metrics + the step loop task."""

    def __init__(self, model: PerfModel, metrics: InstanceMetrics, time_scale: float = 1.0) -> None:
        self.model = model
        self.metrics = metrics
        self.time_scale = time_scale
        self.slowdown = 1.0
        self.scheduler = Scheduler(model)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Emission gaps |actual write time - scheduled step end|, a ring the benchmark reads.
        self.emission_gaps = array("d", bytes(8 * GAP_RING))
        self.emission_count = 0

    def queue_state(self) -> QueueState:
        s = self.scheduler
        return QueueState(s.num_running, len(s.waiting), len(s.transferring), s.kv_usage, s.preemptions)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, request: SimRequest) -> None:
        self.scheduler.add(request)
        self._wake.set()

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

    def record_gap(self, gap: float) -> None:
        self.emission_gaps[self.emission_count % GAP_RING] = gap if gap >= 0 else -gap
        self.emission_count += 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_start = loop.time()
        while True:
            now = loop.time()
            start = next_start if now - next_start < _MAX_CATCH_UP_S else now
            plan = self.scheduler.plan(start)
            if plan is None:
                ready = self.scheduler.next_kv_ready()
                self._wake.clear()
                if ready is None:
                    await self._wake.wait()
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), max(0.0, ready - now))
                next_start = loop.time()
                continue
            end = start + plan.seconds * self.slowdown / self.time_scale
            self._prepare(plan)
            delay = end - loop.time() - _TIMER_LEAD_S
            if delay > 0:
                await asyncio.sleep(delay)
            scheduler = self.scheduler
            outcome = scheduler.complete(plan, end)
            self._emit(outcome, end)
            next_start = end

    @staticmethod
    def _prepare(plan: StepPlan) -> None:
        """Format every chunk this step will emit before it ends, so that at the step's end only the
        socket writes remain between the scheduled and the actual emission."""
        for request, tokens in plan.work:
            sink = request.sink
            if sink is None or request.computed + tokens < request.prefill_target:
                continue  # a prefill chunk that does not finish the prompt emits nothing
            index = request.generated + 1
            sink.prepare(request, index, index >= request.output_tokens)

    def _emit(self, outcome: StepOutcome, end: float) -> None:
        # Writes first (they are what clients time), bookkeeping after.
        for request in outcome.emitted:
            if request.sink is not None:
                request.sink.on_token(request, end)
        metrics = self.metrics
        itl = metrics.itl
        for request in outcome.emitted:
            if request.prev_token_time is None:
                metrics.ttft.observe(end - request.arrival)
                metrics.prompt_tokens += request.prompt_tokens
                metrics.prefix_queries += request.prompt_tokens
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


def loop_to_unix_offset() -> float:
    """Add to an event-loop time to get a unix time (both clocks read back to back)."""
    return time.time() - asyncio.get_running_loop().time()
