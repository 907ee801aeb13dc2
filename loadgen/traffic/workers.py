"""Load generation across cores (and machines): one level's traffic from several processes.

Every process holds the same plan and the same seeded requests and sends its share of them:
`Share(index, count)` is one of `count` shares. Closed loop at concurrency C: client c belongs to
share c % n (n = min(count, C)), and request i to client i % C, so each share sends the requests
of its clients (its own concurrency, and requests in proportion). Open loop: request i belongs to
share i % count and goes at its planned arrival time from a start the shares agree on. The
records keep the level-wide request index, so merged and sorted they are the one level's table.

A `--shard M/K` run is machine M of K, each with the same `--workers N`: its processes are
shares M*N .. M*N+N-1 of K*N, and its run folder holds only their records (merged later with the
other machines' folders).
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from crossover.errors import UserError
from crossover.eventloop import loop_factory
from crossover.loadgen.plan import Mode, SweepPlan, TopologyInfo
from crossover.loadgen.traffic.client import ClientOptions, RequestRecord

BARRIER_TIMEOUT_S = 120.0  # a share whose process did not start by then fails the level


@dataclass(frozen=True)
class Share:
    """One of `count` shares of a level's traffic."""

    index: int = 0
    count: int = 1

    def active(self, plan: SweepPlan, level: float) -> int:
        """How many shares carry traffic at this level (a closed loop has at most C clients)."""
        return min(self.count, int(level)) if plan.mode is Mode.CLOSED else self.count

    def clients(self, level: float) -> list[int]:
        """Closed loop: the level-wide numbers of this share's clients."""
        concurrency = int(level)
        n = min(self.count, concurrency)
        return [c for c in range(concurrency) if c % n == self.index]

    def owns(self, plan: SweepPlan, level: float, index: int) -> bool:
        """Whether request `index` of the level is this share's to send."""
        if self.count == 1:
            return True
        if plan.mode is Mode.CLOSED:
            concurrency = int(level)
            return (index % concurrency) % min(self.count, concurrency) == self.index
        return index % self.count == self.index


def parse_shard(text: str | None) -> tuple[int, int]:
    """"M/K" -> (M, K), machine M (0-based) of K; None -> (0, 1)."""
    if text is None:
        return 0, 1
    index, sep, count = str(text).partition("/")
    try:
        m, k = int(index), int(count)
    except ValueError:
        m, k = -1, 0
    if not sep or k < 1 or not 0 <= m < k:
        raise UserError(f"--shard: want M/K with 0 <= M < K (this machine's number of K), got {text!r}")
    return m, k


def check_workers(workers: int) -> None:
    cores = len(os.sched_getaffinity(0))
    if not 1 <= workers <= cores:
        raise UserError(f"--workers: must be between 1 and this machine's {cores} cores, got {workers}")


def shares(workers: int, shard: tuple[int, int] = (0, 1)) -> list[Share]:
    machine, machines = shard
    return [Share(machine * workers + j, machines * workers) for j in range(workers)]


# What a worker process holds from its start (set by _start): the stop flag, the requests-done
# counters (one per share, in shared memory: a queue's feeder thread would take the GIL from the
# event loop once per request), and the barrier that starts every share of a level together.
_stop: Any = None
_progress: Any = None
_barrier: Any = None
_slot = 0  # this process's counter in _progress, for the level it runs


def _start(stop: Any, progress: Any, barrier: Any) -> None:
    global _stop, _progress, _barrier
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which sets `stop`
    _stop, _progress, _barrier = stop, progress, barrier


def _report(topology: str, level: float, done: int, total: int | None) -> None:
    if _progress is not None:
        _progress[_slot] += 1  # one writer per counter: the parent only reads


def _run_share(info: TopologyInfo, model: str, plan: SweepPlan, level: float, share: Share,
               client: ClientOptions, prepared: list[Any], slot: int) -> list[RequestRecord] | None:
    """In a worker process: wait for every share, then send this one's requests; None if stopped."""
    from crossover.loadgen.sweep import _LevelRunner, _run_or_stop

    global _slot
    _slot = slot
    _barrier.wait(BARRIER_TIMEOUT_S)
    runner = _LevelRunner(info, model, plan, level, _report, client, iter(prepared), share=share)
    with asyncio.Runner(loop_factory=loop_factory("auto" if client.uvloop else "asyncio")) as loop:
        return loop.run(_run_or_stop(runner.run(), _stop))


class WorkerPool:
    """`shares` run as processes kept for the whole sweep (spawned: the parent may hold threads)."""

    def __init__(self, share_list: list[Share], client: ClientOptions) -> None:
        context = multiprocessing.get_context("spawn")
        self.shares = share_list
        self.client = client
        self.stop = context.Event()
        self.progress = context.RawArray("q", len(share_list))
        self.counted = 0  # requests done that the parent has passed on
        self.executor = ProcessPoolExecutor(
            len(share_list), mp_context=context, initializer=_start,
            initargs=(self.stop, self.progress, context.Barrier(len(share_list))))

    def close(self) -> None:
        self.stop.set()
        self.executor.shutdown(wait=True, cancel_futures=True)

    def _pass_on(self, on_request: Callable[[int], None] | None) -> None:
        """The requests finished since the last call, to `on_request`."""
        done = sum(self.progress)
        new, self.counted = done - self.counted, done
        if new and on_request is not None:
            on_request(new)

    async def run_level(self, info: TopologyInfo, model: str, plan: SweepPlan, level: float,
                        prepared: list[Any], stop: Any,
                        on_request: Callable[[int], None] | None) -> list[RequestRecord] | None:
        """The level's prepared requests from every share, records merged; None when `stop` was set
        first. Each process gets only its share's requests (and their bodies)."""
        futures = [asyncio.wrap_future(self.executor.submit(
            _run_share, info, model, plan, level, share, self.client,
            [p for p in prepared if share.owns(plan, level, p[0].index)], slot))
            for slot, share in enumerate(self.shares)]
        pending = set(futures)
        while pending:
            _, pending = await asyncio.wait(pending, timeout=0.05)
            if stop is not None and stop.is_set():
                self.stop.set()
            self._pass_on(on_request)
        self._pass_on(on_request)  # what finished after the last look
        parts = [f.result() for f in futures]
        if any(part is None for part in parts):
            return None
        return [record for part in parts if part is not None for record in part]
