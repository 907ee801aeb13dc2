"""A one-shot timer on the monotonic clock with microsecond precision, for the engine's step ends.

Event loops wait in whole milliseconds: asyncio's epoll rounds its timeout up (a timer fires 0-1 ms
late) and uvloop keeps its clock and timers in whole milliseconds (+-1 ms). A token written 1 ms off
its step's end is 1 ms of emission error, half the simulator's 2 ms budget, before any write has
been made. A Linux timerfd armed on an absolute CLOCK_MONOTONIC time (the clock `time.monotonic()`
reads) fires within the kernel's timer slack (50 us), and as a readable file descriptor it wakes
any event loop through `add_reader`. Where there is no timerfd (not Linux, no libc), the loop's own
`call_at` is used, aimed half a millisecond early to centre its rounding on zero.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import sys
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC
_TFD_TIMER_ABSTIME = 1
# Half of epoll's millisecond rounding: the fallback's error is then centred on zero.
FALLBACK_LEAD_S = 0.0005


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _load_libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec),
                                         ctypes.c_void_p]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()


class PreciseTimer:
    """Calls `callback` once at the monotonic time given to `at` (re-arming replaces the pending
    time); `cancel` disarms it, `close` releases the descriptor. Not thread-safe: one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None
        self._fd = -1
        self._spec = _Itimerspec()
        if _LIBC is not None:
            fd = _LIBC.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._on_readable)

    @property
    def precise(self) -> bool:
        return self._fd >= 0

    def at(self, when: float) -> None:
        if self._fd < 0:
            if self._handle is not None:
                self._handle.cancel()
            self._handle = self._loop.call_at(when - FALLBACK_LEAD_S, self._fire)
            return
        seconds = int(when)
        self._set(seconds, int((when - seconds) * 1e9) or 1)  # 0 ns would disarm it

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._fd >= 0:
            self._set(0, 0)

    def close(self) -> None:
        self.cancel()
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def _set(self, seconds: int, nanoseconds: int) -> None:
        value = self._spec.it_value
        value.tv_sec = seconds
        value.tv_nsec = nanoseconds
        if _LIBC is not None and _LIBC.timerfd_settime(self._fd, _TFD_TIMER_ABSTIME,
                                                        ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")

    def _on_readable(self) -> None:
        try:
            os.read(self._fd, 8)  # the expiry count; reading re-arms readiness for the next shot
        except BlockingIOError:
            return  # re-armed or cancelled after it fired: nothing is due
        self._callback()

    def _fire(self) -> None:
        self._handle = None
        self._callback()
