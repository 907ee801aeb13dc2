"""The simulator's garbage-collector policy (`crossover sim --gc`) and its record of collector pauses.

A collection stops the one event loop that streams every instance's tokens, so how long and how often
the collector runs shows up directly in the emission gap. What a collection costs is the number of
tracked objects it scans: every in-flight stream holds ~35 (aiohttp's request, task, coroutines,
header dicts, the response and writer; the sink and SimRequest), so at 2,000 streams a collection that
reaches them scans ~70,000 objects, ~70 ms on this machine's cores. CPython triggers its young
collection on the *net* count of tracked objects, which barely moves in steady state (every finished
stream frees what it allocated), so young collections come rarely and, when they come, every stream
started since the last one is still in the young generation: each is a full ~70 ms scan.

`crossover sim --gc N` keeps CPython's automatic collector with a young threshold of N allocations
(default 20,000).

`--gc freeze` keeps the in-flight streams out of every collection instead: every FREEZE_EVERY_S, a
young collection of what was allocated since the last tick (short-lived cycles die there: an aborted
stream's traceback), then `gc.freeze()`, which moves the survivors into the permanent generation that
collections never scan (O(1); reference counting still frees them when their stream ends). The young
generation then holds a quarter of a second of new streams (4-13 ms to collect at 2,000 streams), so
no pause grows with the streams in flight. A cycle whose objects were frozen before it became garbage
escapes those collections: a streamed completion leaves none, a stream cut mid-way can leave some
(its handler's traceback). After FULL_AFTER_CUTS cut streams (the engines count them) the tick
unfreezes, collects everything (one long pause, ~100 ms at 2,000 streams) and freezes again. (The
frozen count itself is no trigger: `gc.get_freeze_count()` walks the whole permanent generation, ~25
ms at 2,000 streams.) With the emitter thread (sim/fastpath.py), whose ~35 ms of lead absorbs the
young collections, this is what holds the emission gap at 2,000 streams (docs/performance.md).

`--gc auto` is `freeze` where the emitter thread writes the tokens, `N` = 20,000 where the loop does.

The collector is process-wide (its thresholds, its frozen generation, `gc.callbacks`), and so is what a
CollectorPolicy sets: its owner is the one fleet `crossover sim` runs (sim/fleet.py), which starts it
once every instance is up and stops it on the way down. The state lives in that object (its PauseLog
and Freezer), none in this module.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable
from typing import Any

DEFAULT_YOUNG = 20_000
AUTO = "auto"
FREEZE = "freeze"
FREEZE_EVERY_S = 0.25
FULL_AFTER_CUTS = 10_000
PAUSE_RING = 4096  # the pauses kept for /admin/stats (the longest are reported)


def parse(text: str) -> int:
    """`--gc` value -> the young-generation threshold (the default one for `freeze` and `auto`);
    ValueError if it is neither a positive integer, `freeze` nor `auto`."""
    if text in (FREEZE, AUTO):
        return DEFAULT_YOUNG
    young = int(text)
    if young < 1:
        raise ValueError("the young-generation threshold must be positive")
    return young


def resolve(text: str, threaded_emitter: bool) -> str:
    """`auto`: freeze where the emitter thread writes the tokens (its lead absorbs the young
    collections), the default threshold where the loop does (each young collection would delay them)."""
    if text != AUTO:
        return text
    return FREEZE if threaded_emitter else str(DEFAULT_YOUNG)


class PauseLog:
    """Every collection of the process timed while installed (a gc.callbacks entry: two perf_counter
    reads per collection): count, total and longest pause per generation, and the last PAUSE_RING
    pauses."""

    __slots__ = ("_start", "collections", "installed", "max_s", "pauses", "seconds")

    def __init__(self) -> None:
        self._start = 0.0
        self.pauses: deque[tuple[float, int, int, float]] = deque(maxlen=PAUSE_RING)
        # (unix time, generation, collected, seconds)
        self.collections = [0, 0, 0]  # per generation since the last reset
        self.seconds = [0.0, 0.0, 0.0]
        self.max_s = [0.0, 0.0, 0.0]
        self.installed = False

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        """The gc.callbacks entry."""
        if phase == "start":
            self._start = time.perf_counter()
            return
        seconds = time.perf_counter() - self._start
        generation = int(info["generation"])
        self.collections[generation] += 1
        self.seconds[generation] += seconds
        if seconds > self.max_s[generation]:
            self.max_s[generation] = seconds
        self.pauses.append((time.time(), generation, int(info["collected"]), seconds))

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self.on_collection)
            self.installed = True

    def remove(self) -> None:
        if self.installed:
            gc.callbacks.remove(self.on_collection)
            self.installed = False

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """Collections per generation since the last reset: count, total and longest pause, and the
        pauses of 1 ms or more (unix time, generation, objects collected, seconds)."""
        out = {"collections": list(self.collections), "seconds": list(self.seconds),
               "max_s": list(self.max_s), "long_pauses": [p for p in self.pauses if p[3] >= 0.001]}
        if reset:
            self.pauses.clear()
            self.collections[:] = [0, 0, 0]
            self.seconds[:] = [0.0, 0.0, 0.0]
            self.max_s[:] = [0.0, 0.0, 0.0]
        return out


class Freezer:
    """`--gc freeze` on a running loop: a young collection, then gc.freeze(), every FREEZE_EVERY_S.
    `cuts` counts the streams cut mid-way so far (the engines' cut requests)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cuts: Callable[[], int],
                 every_s: float = FREEZE_EVERY_S, full_after_cuts: int = FULL_AFTER_CUTS) -> None:
        self.loop = loop
        self.cuts = cuts
        self.every_s = every_s
        self.full_after_cuts = full_after_cuts
        self.full_collections = 0
        self._cuts_at_full = cuts()
        self._handle: asyncio.TimerHandle | None = loop.call_later(every_s, self._tick)

    def _tick(self) -> None:
        gc.collect(0)
        gc.freeze()
        cuts = self.cuts()
        if cuts - self._cuts_at_full >= self.full_after_cuts:  # frozen cycles may have piled up
            self._cuts_at_full = cuts
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_collections += 1
        self._handle = self.loop.call_later(self.every_s, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class CollectorPolicy:
    """One `--gc` policy (after `resolve`), applied to the process from start() to stop(): the young
    threshold, the freeze ticks with `freeze`, and the pause log /admin/stats reports. `cuts` counts
    the streams cut mid-way so far (the fleet's engines)."""

    def __init__(self, policy: str, cuts: Callable[[], int]) -> None:
        self.young = parse(policy)  # ValueError before anything is applied
        self.policy = policy
        self.cuts = cuts
        self.pauses = PauseLog()
        self.freezer: Freezer | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Once the fleet is up: everything built so far lives as long as the process, so it is kept
        out of the collector's way (`gc.freeze()`), and the policy applies from here on."""
        gc.freeze()
        gc.set_threshold(self.young, 50, 100)
        gc.enable()
        self.pauses.install()
        if self.policy == FREEZE and self.freezer is None:
            self.freezer = Freezer(loop, self.cuts)

    def stop(self) -> None:
        """Stop the freeze ticks and the timing (the threshold stays as set)."""
        if self.freezer is not None:
            self.freezer.stop()
            self.freezer = None
        self.pauses.remove()

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """The pause log (since the last reset), the collector's counts and thresholds, the policy."""
        out = self.pauses.stats(reset)
        return {"collections": out["collections"], "seconds": out["seconds"], "max_s": out["max_s"],
                "count": list(gc.get_count()), "threshold": list(gc.get_threshold()),
                "automatic": gc.isenabled(), "policy": self.policy, "long_pauses": out["long_pauses"]}
