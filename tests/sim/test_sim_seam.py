"""The simulator's speed machinery stays behind its seam: the engine, the server and the write path's
default know a token sink and nothing of threads, descriptors or the collector (sim/fastpath.py and
sim/gcpolicy.py do, plugged in by the fleet at start), and the engines count the cut streams the
collector policy needs."""

from __future__ import annotations

import ast
import asyncio
import time
from pathlib import Path

from crossover.sim.scheduler import SimRequest
from crossover.sim.server import SimInstance
from crossover.sim.writer import WritePath
from crossover.spec import load_spec
from tests.helpers import SPECS

SIM = Path(__file__).resolve().parents[2] / "sim"
# what the speed machinery is made of: the plug-in, the collector policy, the native thread,
# descriptors, the collector
MACHINERY = {"crossover.sim.fastpath", "crossover.sim.gcpolicy", "crossover.sim._emitter", "threading",
             "socket", "os", "gc", "select"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_the_engine_and_the_server_know_no_speed_machinery() -> None:
    for name in ("engine.py", "server.py", "writer.py", "scheduler.py"):
        assert not _imports(SIM / name) & MACHINERY, (name, sorted(_imports(SIM / name) & MACHINERY))
    # plugged in there, at start
    assert {"crossover.sim.fastpath", "crossover.sim.gcpolicy"} <= _imports(SIM / "fleet.py")


def test_the_speed_machinery_keeps_no_module_level_state() -> None:
    """Each job's state is its object's (the emitter's FastPath, the collector's CollectorPolicy): no
    module-level assignment of a mutable value in either module."""
    for name in ("fastpath.py", "gcpolicy.py"):
        for node in ast.parse((SIM / name).read_text()).body:
            if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
                assert not isinstance(node.value, ast.List | ast.Dict | ast.Set | ast.ListComp
                                      | ast.DictComp | ast.SetComp | ast.Call), (name, ast.unparse(node))


def test_engines_count_the_streams_cut_before_their_last_token() -> None:
    spec = load_spec(SPECS / "seed-70b-h100.yaml")
    topology = spec.topologies[0]
    engine = SimInstance(spec, topology, topology.instances[0]).engine

    async def run() -> tuple[int, int, int]:
        engine.start(WritePath())
        requests = [SimRequest(f"r{n}", 8, 1000, time.monotonic(), "length") for n in range(3)]
        for request in requests:
            engine.submit(request)
        engine.abort(requests[0])
        engine.abort(requests[0])  # the same request again: one cut
        after_abort = engine.cut_requests
        done = SimRequest("done", 8, 1, time.monotonic(), "length")
        done.finished = True
        engine.abort(done)  # a finished request is not cut
        after_finished = engine.cut_requests
        engine.reset()  # a restart cuts what is left
        after_reset = engine.cut_requests
        await engine.stop()
        return after_abort, after_finished, after_reset

    assert asyncio.run(run()) == (1, 1, 3)
