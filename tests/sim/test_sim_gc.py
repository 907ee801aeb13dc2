"""The simulator's collector policy (`crossover sim --gc`) and its pause record."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from crossover.sim import fastpath


@pytest.fixture
def restore_gc() -> Iterator[None]:
    threshold, enabled = gc.get_threshold(), gc.isenabled()
    try:
        yield
    finally:
        fastpath.apply(str(fastpath.DEFAULT_YOUNG))
        gc.set_threshold(*threshold)
        (gc.enable if enabled else gc.disable)()


def test_parse() -> None:
    assert fastpath.parse("20000") == 20000
    for bad in ("often", "0", "-5", "idle", "frozen"):
        with pytest.raises(ValueError):
            fastpath.parse(bad)


def test_auto_policy_freezes_only_behind_the_emitter_thread() -> None:
    assert fastpath.resolve("auto", threaded_emitter=True) == "freeze"
    assert fastpath.resolve("auto", threaded_emitter=False) == str(fastpath.DEFAULT_YOUNG)
    assert fastpath.resolve("5000", threaded_emitter=True) == "5000"
    assert fastpath.parse("auto") == fastpath.DEFAULT_YOUNG


def test_threshold_is_set_and_collections_are_recorded(restore_gc: None) -> None:
    fastpath.install()
    fastpath.apply("5000")
    assert gc.isenabled() and gc.get_threshold()[0] == 5000
    fastpath.stats(reset=True)
    gc.collect(0)
    gc.collect()
    stats = fastpath.stats(reset=True)
    assert stats["collections"] == [1, 0, 1] and stats["policy"] == "5000"
    assert stats["seconds"][0] > 0 and stats["max_s"][2] > 0
    assert fastpath.stats()["collections"] == [0, 0, 0]


def test_freeze_policy_keeps_survivors_out_and_collects_young_cycles(restore_gc: None) -> None:
    """`--gc freeze`: each tick collects the young generation (an orphaned cycle dies there) and then
    freezes the survivors, so no later collection scans them."""
    import asyncio
    import weakref

    class Node:
        pass

    assert fastpath.parse("freeze") == fastpath.DEFAULT_YOUNG
    fastpath.apply("freeze")
    survivors = [Node() for _ in range(1000)]  # in-flight streams' objects
    orphan = Node()
    orphan.self = orphan  # type: ignore[attr-defined]
    gone = weakref.ref(orphan)
    del orphan
    frozen_before = gc.get_freeze_count()

    cuts = [0]  # streams cut mid-way, as the engines count them

    async def ticks(freezer_args: dict[str, int], seconds: float, cut: int = 0) -> fastpath.Freezer:
        freezer = fastpath.Freezer(asyncio.get_running_loop(), lambda: cuts[0], every_s=0.01,
                                   **freezer_args)
        cuts[0] += cut  # streams cut while it runs
        await asyncio.sleep(seconds)
        freezer.stop()
        return freezer

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
    finally:
        gc.unfreeze()


def test_engine_keeps_its_phase_after_a_long_stall() -> None:
    """After a stall past the catch-up limit the step chain skips whole steps, staying on its grid
    (restarting at "now" would phase-lock every instance of the loop after a shared stall)."""
    import asyncio
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
