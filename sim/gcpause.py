"""The simulator's garbage-collector policy and a record of its pauses (`/admin/stats`, "gc").

A collection stops the one event loop that streams every instance's tokens, so how long and how often
the collector runs shows up directly in the emission gap. What a collection costs is the number of
tracked objects it scans: every in-flight stream holds ~35 (aiohttp's request, task, coroutines,
header dicts, the response and writer; the sink and SimRequest), so at 2,000 streams a collection
that reaches them scans ~70,000 objects, ~70 ms on this machine's cores. CPython triggers its young
collection on the *net* count of tracked objects, which barely moves in steady state (every finished
stream frees what it allocated), so young collections come rarely and, when they come, every stream
started since the last one is still in the young generation: each is a full ~70 ms scan.

Two policies (`crossover sim --gc`):

- `N` (an integer, default 20,000): CPython's automatic collector, young threshold N allocations.
- `idle[:MS[:S]]`: automatic collection off; the engine collects the young generation every MS
  milliseconds (default 100) when no instance's write burst is due for 1 ms plus 1.5x the mean young
  pause (`maybe_collect`), so the young generation only holds what was allocated since (the streams
  started meanwhile and the steps in flight: 1-3 ms measured at 2,000 streams on a loaded machine),
  and its survivors move on; at 2,000 streams over 8 instances such gaps are rare and most came from
  the backstop (collect regardless after 10x MS: 10-20 ms). Everything (`gc.collect()`) is collected
  every S seconds (default 600): that full scan (170-190 ms at 2,000 streams, measured while the
  request records were still tracked) is the long pause left, and it finds the cyclic garbage of
  every generation, so nothing waits longer than S to be freed. A watchdog timer on the loop
  collects when the engine has not for 10x MS (an idle fleet still serving admin requests).
The default stays the automatic collector: the idle policy did not win in measured runs
(docs/performance.md, simulator section).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

DEFAULT_YOUNG = 20_000
_RING = 4096

_start = [0.0]
_pauses: list[tuple[float, int, int, float]] = []  # (unix time, generation, collected, seconds)
_collections = [0, 0, 0]  # per generation since the last reset
_seconds = [0.0, 0.0, 0.0]
_max_s = [0.0, 0.0, 0.0]
_installed = [False]
_young_cost = [0.001]  # running mean of a young collection's pause (s)


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
    if generation == 0:
        _young_cost[0] += 0.1 * (seconds - _young_cost[0])
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


# --- policy --------------------------------------------------------------------------------------------
IDLE_YOUNG_S = 0.1
IDLE_FULL_S = 600.0
QUIET_S = 0.001  # a young collection waits for a gap this long, plus 1.5x its mean pause, before a burst
_policy = ["default"]
_idle = [0.0, IDLE_FULL_S]  # young and full collection periods (s); young 0: automatic collection
_last = [0.0, 0.0]  # monotonic time of the last young and full collection


def parse(text: str) -> tuple[str, float, float]:
    """`--gc` value -> ("threshold", N, 0) or ("idle", young period s, full period s)."""
    if text.startswith("idle"):
        parts = [p for p in text[4:].split(":") if p]
        young = float(parts[0]) / 1000 if parts else IDLE_YOUNG_S
        full = float(parts[1]) if len(parts) > 1 else IDLE_FULL_S
        if young <= 0 or full <= 0 or len(parts) > 2:
            raise ValueError("idle[:MS[:S]] needs positive periods")
        return "idle", young, full
    young = int(text)
    if young < 1:
        raise ValueError("the young-generation threshold must be positive")
    return "threshold", young, 0.0


def apply(text: str = str(DEFAULT_YOUNG)) -> None:
    """Set the policy; call after start-up, once everything built so far is frozen out of the
    collector's way (`gc.freeze()`)."""
    kind, young, full = parse(text)
    _policy[0] = text
    if kind == "idle":
        _idle[0], _idle[1] = young, full
        _last[0] = _last[1] = time.monotonic()
        gc.disable()
    else:
        _idle[0] = 0.0
        gc.set_threshold(int(young), 50, 100)
        gc.enable()


def idle_threshold() -> float:
    """The idle policy's young period (s); 0 under automatic collection."""
    return _idle[0]


def maybe_collect(quiet_s: float) -> None:
    """Under the idle policy, called by the engine between write bursts with the time until the next
    burst is due: collects the young generation once its period has passed and the loop is quiet
    (or 10 periods have passed regardless), everything once the full period has passed."""
    young = _idle[0]
    now = time.monotonic()
    since = now - _last[0]
    if since < young or (quiet_s < QUIET_S + 1.5 * _young_cost[0] and since < 10 * young):
        return
    _last[0] = now
    if now - _last[1] >= _idle[1]:
        _last[1] = now
        gc.collect()
    else:
        gc.collect(0)


def watchdog(loop: asyncio.AbstractEventLoop) -> None:
    """Under the idle policy, collect when the engine has not for 10 young periods (no steps run)."""
    young = _idle[0]
    if not young:
        return
    if time.monotonic() - _last[0] >= 10 * young:
        maybe_collect(1.0)
    loop.call_later(10 * young, watchdog, loop)
