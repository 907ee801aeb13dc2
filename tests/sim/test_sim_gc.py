"""The simulator's collector policy (`crossover sim --gc`) and its pause record."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator

import pytest

from crossover.sim import gcpolicy


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold, enabled, callbacks = gc.get_threshold(), gc.isenabled(), list(gc.callbacks)
    try:
        yield
    finally:
        gc.callbacks[:] = callbacks
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()


def test_parse() -> None:
    assert gcpolicy.parse("20000") == 20000
    for bad in ("often", "0", "-5", "idle", "frozen"):
        with pytest.raises(ValueError):
            gcpolicy.parse(bad)
        with pytest.raises(ValueError):
            gcpolicy.CollectorPolicy(bad, lambda: 0)


def test_auto_policy_freezes_only_behind_the_emitter_thread() -> None:
    assert gcpolicy.resolve("auto", threaded_emitter=True) == "freeze"
    assert gcpolicy.resolve("auto", threaded_emitter=False) == str(gcpolicy.DEFAULT_YOUNG)
    assert gcpolicy.resolve("5000", threaded_emitter=True) == "5000"
    assert gcpolicy.parse("auto") == gcpolicy.DEFAULT_YOUNG


def test_threshold_is_set_and_collections_are_recorded(restore_gc: None) -> None:
    policy = gcpolicy.CollectorPolicy("5000", lambda: 0)

    async def start() -> None:
        policy.start(asyncio.get_running_loop())

    try:
        asyncio.run(start())
        assert gc.isenabled() and gc.get_threshold()[0] == 5000
        assert policy.freezer is None and gc.callbacks.count(policy.pauses.on_collection) == 1
        policy.stats(reset=True)
        gc.collect(0)
        gc.collect()
        stats = policy.stats(reset=True)
        assert stats["collections"] == [1, 0, 1] and stats["policy"] == "5000"
        assert stats["seconds"][0] > 0 and stats["max_s"][2] > 0
        assert policy.stats()["collections"] == [0, 0, 0]
    finally:
        policy.stop()
        gc.unfreeze()
    assert policy.pauses.on_collection not in gc.callbacks  # stopped: no longer timed
    gc.collect()
    assert policy.stats()["collections"] == [0, 0, 0]


def test_pause_logs_keep_their_own_record() -> None:
    """The record is the log's, not the module's: two logs, each counted from its own install."""
    first, second = gcpolicy.PauseLog(), gcpolicy.PauseLog()
    first.install()
    first.install()  # once only
    try:
        gc.collect()
        second.install()
        gc.collect()
    finally:
        first.remove()
        second.remove()
    gc.collect()
    assert first.stats()["collections"][2] == 2 and second.stats()["collections"][2] == 1
    assert first.on_collection not in gc.callbacks and second.on_collection not in gc.callbacks


def test_freeze_policy_keeps_survivors_out_and_collects_young_cycles(restore_gc: None) -> None:
    """`--gc freeze`: each tick collects the young generation (an orphaned cycle dies there) and then
    freezes the survivors, so no later collection scans them."""
    import weakref

    class Node:
        pass

    assert gcpolicy.parse("freeze") == gcpolicy.DEFAULT_YOUNG
    survivors = [Node() for _ in range(1000)]  # in-flight streams' objects
    orphan = Node()
    orphan.self = orphan  # type: ignore[attr-defined]
    gone = weakref.ref(orphan)
    del orphan
    frozen_before = gc.get_freeze_count()

    cuts = [0]  # streams cut mid-way, as the engines count them

    async def ticks(freezer_args: dict[str, int], seconds: float, cut: int = 0) -> gcpolicy.Freezer:
        freezer = gcpolicy.Freezer(asyncio.get_running_loop(), lambda: cuts[0], every_s=0.01,
                                   **freezer_args)
        cuts[0] += cut  # streams cut while it runs
        await asyncio.sleep(seconds)
        freezer.stop()
        return freezer

    async def policy_ticks() -> gcpolicy.CollectorPolicy:
        policy = gcpolicy.CollectorPolicy("freeze", lambda: cuts[0])
        policy.start(asyncio.get_running_loop())
        assert policy.freezer is not None and gc.get_threshold()[0] == gcpolicy.DEFAULT_YOUNG
        policy.stop()
        assert policy.freezer is None
        return policy

    try:
        asyncio.run(ticks({}, 0.035))
        assert gone() is None, "a young cycle outlived the tick's collection"
        assert gc.get_freeze_count() >= frozen_before + len(survivors)
        assert all(gc.is_tracked(s) for s in survivors)
        # A cycle frozen while alive and orphaned later is left to the full collection, which comes
        # once enough streams have been cut.
        late = Node()
        late.self = late  # type: ignore[attr-defined]
        late_gone = weakref.ref(late)
        gc.freeze()
        del late
        cuts[0] = 5  # cut before the next freezer starts: not its business
        freezer = asyncio.run(ticks({"full_after_cuts": 2}, 0.035, cut=1))
        assert late_gone() is not None and freezer.full_collections == 0
        freezer = asyncio.run(ticks({"full_after_cuts": 2}, 0.035, cut=2))
        assert freezer.full_collections == 1 and late_gone() is None
        asyncio.run(policy_ticks())  # the policy runs the same ticks
    finally:
        gc.unfreeze()


@pytest.mark.parametrize(("emitter", "policy"), [("loop", "20000"), ("thread", "freeze")])
def test_the_fleet_owns_its_collector_policy(restore_gc: None, emitter: str, policy: str) -> None:
    """`crossover sim --gc auto` resolves with the emitter, applies from the fleet's start to its stop,
    and is reported in /admin/stats beside the emitter's counters; a fleet without one reports none."""
    from crossover.errors import UserError
    from crossover.netutil import spec_on_free_ports
    from crossover.sim import fastpath
    from crossover.sim.fleet import SimFleet
    from crossover.spec import load_spec
    from tests.helpers import SPECS

    if emitter == "thread" and not fastpath.available():
        pytest.skip("the emitter module is not built")
    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))

    async def run(gc_policy: str | None) -> tuple[SimFleet, dict, dict]:
        fleet = SimFleet(spec, emitter=emitter, gc_policy=gc_policy)
        await fleet.start()
        try:
            return fleet, fleet.path.stats(reset=False), fleet.instance("tp4-0").path.stats(reset=True)
        finally:
            await fleet.stop()

    try:
        fleet, stats, same = asyncio.run(run("auto"))
        assert fleet.collector is not None and fleet.collector.policy == policy
        assert stats["gc"]["policy"] == policy and gc.get_threshold()[0] == gcpolicy.DEFAULT_YOUNG
        assert same["gc"]["policy"] == policy  # every instance reports the process's collector
        assert ("emitter" in stats) == (emitter == "thread")
        assert fleet.collector.pauses.on_collection not in gc.callbacks  # stopped with the fleet
        assert fleet.collector.freezer is None
        _, stats, _ = asyncio.run(run(None))
        assert "gc" not in stats
    finally:
        gc.unfreeze()
    with pytest.raises(UserError, match="--gc must be"):
        SimFleet(spec, emitter=emitter, gc_policy="often")


def test_engine_keeps_its_phase_after_a_long_stall() -> None:
    """After a stall past the catch-up limit the step chain skips whole steps, staying on its grid
    (restarting at "now" would phase-lock every instance of the loop after a shared stall)."""
    import sys
    import time
    from pathlib import Path

    from crossover.sim.scheduler import SimRequest
    from crossover.sim.server import SimInstance
    from crossover.sim.writer import WritePath
    from crossover.spec import FleetSpec

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_sim

    spec = FleetSpec.model_validate(bench_sim.bench_spec(1, 20))
    topology = spec.topologies[0]
    engine = SimInstance(spec, topology, topology.instances[0]).engine

    async def run() -> tuple[float, float, float]:
        engine.start(WritePath())
        engine.submit(SimRequest("r", 4, 1000, time.monotonic(), "length"))
        await asyncio.sleep(0.1)
        grid, period = engine._end, engine._period
        time.sleep(0.4)  # the loop stalls for 20 steps
        await asyncio.sleep(0.05)
        end = engine._end
        await engine.stop()
        return grid, period, end

    grid, period, end = asyncio.run(run())
    assert period == pytest.approx(0.02, rel=0.01)
    steps = (end - grid) / period
    assert steps > 20 and steps == pytest.approx(round(steps), abs=1e-6)


def test_finished_request_records_are_not_tracked_by_the_collector() -> None:
    """The ring of finished requests (20,000 per instance) must not feed the young collection."""
    import sys
    from array import array
    from pathlib import Path

    from crossover.sim.scheduler import SimRequest
    from crossover.sim.server import SimInstance, record_view
    from crossover.spec import FleetSpec

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_sim

    spec = FleetSpec.model_validate(bench_sim.bench_spec(1, 20))
    topology = spec.topologies[0]
    instance = SimInstance(spec, topology, topology.instances[0])
    record = {"id": "cmpl-1", "arrival": 1.0, "token_times": array("d", [2.0, 3.0]), "prompt_tokens": 4,
              "output_tokens": 0}
    sim = SimRequest("cmpl-1", 4, 2, 0.0, "length")
    sim.generated = 2
    instance._record(record, sim)
    kept = instance.records[-1]
    assert not gc.is_tracked(kept)
    assert record_view(kept) == {"id": "cmpl-1", "arrival": 1.0, "token_times": [2.0, 3.0],
                                 "prompt_tokens": 4, "output_tokens": 2}


@pytest.mark.parametrize(("soft", "hard", "expected"), [
    (1024, 4096, (4096, 4096)),  # raised to the hard limit
    (4096, 4096, None),  # already there
    (1024, "inf", (1 << 20, "inf")),  # no hard limit: a generous soft one
    ("inf", "inf", None),  # never lowered
])
def test_the_descriptor_limit_is_raised_never_lowered(monkeypatch, soft, hard, expected) -> None:
    import resource

    from crossover.sim import cli

    inf = resource.RLIM_INFINITY
    soft, hard = (inf if v == "inf" else v for v in (soft, hard))
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, hard))
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: calls.append(limits))
    cli.raise_descriptor_limit()
    wanted = None if expected is None else tuple(inf if v == "inf" else v for v in expected)
    assert calls == ([] if wanted is None else [wanted])
