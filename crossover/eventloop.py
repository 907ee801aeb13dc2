"""The event loop of the hot processes (simulator, exporter, load generator): uvloop where it is
installed (its transports and timers cost a fraction of asyncio's per write, read and timer), else
asyncio's own."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(kind: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """A factory of new event loops of `kind`: "uvloop" (an ImportError when it is missing),
    "asyncio", or "auto" (uvloop when it can be imported, asyncio otherwise)."""
    if kind not in LOOPS:
        raise ValueError(f"event loop must be one of {', '.join(LOOPS)}, not {kind!r}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    return loop_factory(kind)()
