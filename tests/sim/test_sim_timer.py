"""The engine's step-end timer: fires once, never before its time, re-arms and cancels, on both
event loops; and where there is no timerfd it falls back to the loop's own timer."""

from __future__ import annotations

import asyncio
import time

import pytest

from crossover.eventloop import loop_factory
from crossover.sim import precisetimer
from crossover.sim.precisetimer import PreciseTimer


async def _fire_times(timer_at: list[float], cancel_first: bool = False) -> list[float]:
    loop = asyncio.get_running_loop()
    fired: list[float] = []
    done = asyncio.Event()

    def callback() -> None:
        fired.append(time.monotonic())
        done.set()

    timer = PreciseTimer(loop, callback)
    try:
        for when in timer_at:  # each re-arm replaces the pending time
            timer.at(when)
        if cancel_first:
            timer.cancel()
            await asyncio.sleep(max(timer_at) - time.monotonic() + 0.05)
            return fired
        await asyncio.wait_for(done.wait(), 5)
        await asyncio.sleep(0.05)  # a second shot would land here
        return fired
    finally:
        timer.close()


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_fires_once_at_the_last_armed_time_never_before(loop: str) -> None:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        start = time.monotonic()
        due = start + 0.03
        fired = runner.run(_fire_times([start + 0.01, due]))
    assert len(fired) == 1
    assert fired[0] >= due  # a timerfd on CLOCK_MONOTONIC never fires early


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_cancelled_timer_stays_quiet(loop: str) -> None:
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        assert runner.run(_fire_times([time.monotonic() + 0.02], cancel_first=True)) == []


def test_uses_a_timerfd_on_linux() -> None:
    async def precise() -> bool:
        timer = PreciseTimer(asyncio.get_running_loop(), lambda: None)
        try:
            return timer.precise
        finally:
            timer.close()
    assert asyncio.run(precise())


def test_without_a_timerfd_the_loop_timer_fires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precisetimer, "_LIBC", None)
    with asyncio.Runner() as runner:
        start = time.monotonic()
        fired = runner.run(_fire_times([start + 0.02]))
    assert len(fired) == 1
    assert fired[0] >= start + 0.02 - precisetimer.FALLBACK_LEAD_S - 0.001
