"""The simulator's garbage-collector policy and a record of its pauses (`/admin/stats`, "gc").

A collection stops the one event loop that streams every instance's tokens, so how long and how often
the collector runs shows up directly in the emission gap. What a collection costs is the number of
tracked objects it scans: every in-flight stream holds ~35 (aiohttp's request, task, coroutines,
header dicts, the response and writer; the sink and SimRequest), so at 2,000 streams a collection
that reaches them scans ~70,000 objects, ~70 ms on this machine's cores. CPython triggers its young
collection on the *net* count of tracked objects, which barely moves in steady state (every finished
stream frees what it allocated), so young collections come rarely and, when they come, every stream
started since the last one is still in the young generation: each is a full ~70 ms scan.

`crossover sim --gc N` keeps CPython's automatic collector with a young threshold of N allocations
(default 20,000). An "idle" policy that collected the young generation in the gaps between write
bursts was tried and measured worse at every stream count (docs/performance.md, simulator section).

`--gc freeze` keeps the in-flight streams out of every collection instead: every FREEZE_EVERY_S, a
young collection of what was allocated since the last tick (short-lived cycles die there: an aborted
stream's traceback), then `gc.freeze()`, which moves the survivors into the permanent generation that
collections never scan (O(1); reference counting still frees them when their stream ends). The young
generation then holds a quarter of a second of new streams (4-13 ms to collect at 2,000 streams), so
no pause grows with the streams in flight. A cycle whose objects were frozen before it became garbage
escapes those collections: a streamed completion leaves none, a stream cut mid-way can leave some
(its handler's traceback). After FULL_AFTER_CUTS cut streams (`note_cut`) the tick unfreezes, collects
everything (one long pause, ~100 ms at 2,000 streams) and freezes again. (The frozen count itself is
no trigger: `gc.get_freeze_count()` walks the whole permanent generation, ~25 ms at 2,000 streams.)
With the emitter thread, whose ~35 ms of lead absorbs the young collections, this is what holds the
emission gap at 2,000 streams (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

DEFAULT_YOUNG = 20_000
AUTO = "auto"
FREEZE = "freeze"
FREEZE_EVERY_S = 0.25
FULL_AFTER_CUTS = 10_000
_cuts = [0]  # streams cut mid-way since the last full collection
_RING = 4096

_start = [0.0]
_pauses: list[tuple[float, int, int, float]] = []  # (unix time, generation, collected, seconds)
_collections = [0, 0, 0]  # per generation since the last reset
_seconds = [0.0, 0.0, 0.0]
_max_s = [0.0, 0.0, 0.0]
_installed = [False]


def _callback(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _start[0] = time.perf_counter()
        return
    seconds = time.perf_counter() - _start[0]
    generation = int(info["generation"])
    _collections[generation] += 1
    _seconds[generation] += seconds
    if seconds > _max_s[generation]:
        _max_s[generation] = seconds
    _pauses.append((time.time(), generation, int(info["collected"]), seconds))
    if len(_pauses) > _RING:
        del _pauses[: len(_pauses) - _RING]


def install() -> None:
    """Time every collection from now on (two perf_counter reads per collection)."""
    if not _installed[0]:
        gc.callbacks.append(_callback)
        _installed[0] = True


def stats(reset: bool = False) -> dict[str, Any]:
    """Collections per generation since the last reset: count, total and longest pause, and the pauses
    of 1 ms or more (unix time, generation, objects collected, seconds)."""
    out = {"collections": list(_collections), "seconds": list(_seconds),
           "max_s": list(_max_s), "count": list(gc.get_count()),
           "threshold": list(gc.get_threshold()), "automatic": gc.isenabled(),
           "policy": _policy[0], "long_pauses": [p for p in _pauses if p[3] >= 0.001]}
    if reset:
        _pauses.clear()
        _collections[:] = [0, 0, 0]
        _seconds[:] = [0.0, 0.0, 0.0]
        _max_s[:] = [0.0, 0.0, 0.0]
    return out


_policy = [str(DEFAULT_YOUNG)]


def note_cut() -> None:
    """A stream ended before its last token (client gone, drop or restart fault): the kind of end
    that can leave a frozen cycle."""
    _cuts[0] += 1


def parse(text: str) -> int:
    """`--gc` value -> the young-generation threshold (the default one for `freeze`); ValueError if
    it is neither a positive integer, `freeze` nor `auto`."""
    if text in (FREEZE, AUTO):
        return DEFAULT_YOUNG
    young = int(text)
    if young < 1:
        raise ValueError("the young-generation threshold must be positive")
    return young


def apply(text: str = str(DEFAULT_YOUNG)) -> None:
    """Set the young threshold; call after start-up, once everything built so far is frozen out of
    the collector's way (`gc.freeze()`)."""
    _policy[0] = text
    gc.set_threshold(parse(text), 50, 100)
    gc.enable()


def resolve(text: str, threaded_emitter: bool) -> str:
    """`auto`: freeze where the emitter thread writes the tokens (its lead absorbs the young
    collections), the default threshold where the loop does (each young collection would delay them)."""
    if text != AUTO:
        return text
    return FREEZE if threaded_emitter else str(DEFAULT_YOUNG)


class Freezer:
    """`--gc freeze` on a running loop: a young collection, then gc.freeze(), every FREEZE_EVERY_S."""

    def __init__(self, loop: asyncio.AbstractEventLoop, every_s: float = FREEZE_EVERY_S,
                 full_after_cuts: int = FULL_AFTER_CUTS) -> None:
        self.loop = loop
        self.every_s = every_s
        self.full_after_cuts = full_after_cuts
        self.full_collections = 0
        self._handle: asyncio.TimerHandle | None = loop.call_later(every_s, self._tick)

    def _tick(self) -> None:
        gc.collect(0)
        gc.freeze()
        if _cuts[0] >= self.full_after_cuts:  # frozen cycles may have piled up
            _cuts[0] = 0
            gc.unfreeze()
            gc.collect()
            gc.freeze()
            self.full_collections += 1
        self._handle = self.loop.call_later(self.every_s, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
