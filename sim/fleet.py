"""The whole simulated fleet in one process: every instance of every topology, plus entrypoints."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from crossover.errors import UserError
from crossover.eventloop import new_event_loop
from crossover.pdproxy.proxy import EntrypointProxy
from crossover.sim import fastpath, gcpolicy
from crossover.sim.metrics import legacy_mode
from crossover.sim.server import SimInstance, record_view
from crossover.spec import Fault, FleetSpec

T = TypeVar("T")


def _check_loopback(what: str, host: str) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise UserError(f"{what}: the simulator listens on loopback only, not {host}")


def with_overrides(spec: FleetSpec, *, seed: int | None = None, vllm_version: str | None = None,
                   time_scale: float | None = None) -> FleetSpec:
    """The spec with simulator options replaced (CLI flags), validated like the rest."""
    update: dict[str, Any] = {}
    if seed is not None:
        update["seed"] = seed
    if vllm_version is not None:
        try:
            legacy_mode(vllm_version)
        except ValueError as exc:
            raise UserError(f"--vllm-version: {exc}") from None
        update["vllm_version"] = vllm_version
    if time_scale is not None:
        if not time_scale > 0:
            raise UserError(f"--time-scale must be positive, got {time_scale}")
        update["time_scale"] = time_scale
    if not update:
        return spec
    data = spec.model_dump(mode="json")
    data["simulator"].update(update)
    return FleetSpec.model_validate(data)


class SimFleet:
    """Simulated vLLM instances (and P/D proxies) for every topology of a spec, on one event loop."""

    def __init__(self, spec: FleetSpec, bind_host: str | None = None, emitter: str = "auto",
                 emitter_priority: str = "realtime", gc_policy: str | None = None) -> None:
        """bind_host: listen there (e.g. 0.0.0.0 in a container whose URLs name services) instead of
        on each URL's own host, which must then be loopback. emitter: who writes streamed tokens,
        "thread", "loop" or "auto"; emitter_priority: "realtime" (SCHED_FIFO where the process may)
        or "normal"; gc_policy: the collector's (`--gc`), None to leave it alone (sim/gcpolicy.py: the
        fleet owns the policy, which is process-wide, from start to stop)."""
        try:
            legacy_mode(spec.simulator.vllm_version)
        except ValueError as exc:
            raise UserError(f"simulator.vllm_version: {exc}") from None
        try:
            threaded = fastpath.threaded(emitter)
        except ValueError as exc:
            raise UserError(f"--emitter {exc}") from None
        if emitter_priority not in fastpath.PRIORITIES:
            raise UserError(f"--emitter-priority must be one of {', '.join(fastpath.PRIORITIES)}, "
                            f"not {emitter_priority!r}")
        try:
            self.collector = None if gc_policy is None else \
                gcpolicy.CollectorPolicy(gcpolicy.resolve(gc_policy, threaded), self.cut_streams)
        except ValueError:
            raise UserError(f"--gc must be a positive integer, {gcpolicy.FREEZE} or {gcpolicy.AUTO}, "
                            f"not {gc_policy!r}") from None
        self.spec = spec
        self.path = fastpath.FastPath(threaded, emitter_priority == "realtime", self.collector)
        self.instances: dict[str, SimInstance] = {}
        self.proxies: list[EntrypointProxy] = []
        for topology in spec.topologies:
            for instance in topology.instances:
                sim = SimInstance(spec, topology, instance)
                if bind_host is None:
                    _check_loopback(f"instance {instance.name} ({instance.url})", sim.host)
                else:
                    sim.host = bind_host
                self.instances[instance.name] = sim
            if topology.entrypoint.url is not None:
                proxy = EntrypointProxy(topology, spec.model.name)
                if bind_host is None:
                    _check_loopback(f"topology {topology.name} entrypoint ({proxy.url})", proxy.host)
                else:
                    proxy.host = bind_host
                self.proxies.append(proxy)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started: list[SimInstance | EntrypointProxy] = []

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        servers: list[SimInstance | EntrypointProxy] = [*self.instances.values(), *self.proxies]
        for server in servers:
            try:
                await (server.start(self.path) if isinstance(server, SimInstance) else server.start())
            except OSError as exc:
                await self.stop()
                raise UserError(f"{server.name}: cannot listen on {server.host}:{server.port}: "
                                f"{exc.strerror or exc}") from None
            self._started.append(server)
        if self.collector is not None:
            self.collector.start(self._loop)

    async def stop(self) -> None:
        if self.collector is not None:
            self.collector.stop()
        for server in reversed(self._started):
            await server.stop()
        self._started.clear()

    def cut_streams(self) -> int:
        """Streams cut before their last token so far, over every instance (the collector's cue)."""
        return sum(instance.engine.cut_requests for instance in self.instances.values())

    def lines(self) -> list[str]:
        """One line per served endpoint, for the CLI."""
        out = []
        for topology in self.spec.topologies:
            for instance in topology.instances:
                out.append(f"{instance.name:<14} {instance.url:<28} topology={topology.name} "
                           f"role={instance.role.value} tp={topology.tp_of(instance)}")
            if topology.entrypoint.url is not None:
                kind = "pd-proxy" if topology.disaggregated else "balancer"
                out.append(f"{topology.name + '-entry':<14} {topology.entrypoint.url:<28} "
                           f"topology={topology.name} role={kind}")
        return out

    def instance(self, name: str) -> SimInstance:
        try:
            return self.instances[name]
        except KeyError:
            raise UserError(f"no simulated instance named {name!r} (have {sorted(self.instances)})") from None

    # --- faults from Python, from any thread ---------------------------------------------------
    def _call(self, function: Any, *args: Any) -> Any:
        loop = self._loop
        if loop is None or not loop.is_running():
            return function(*args)
        try:
            if asyncio.get_running_loop() is loop:
                return function(*args)
        except RuntimeError:
            pass

        async def call() -> Any:
            return function(*args)
        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=10)

    def set_fault(self, instance_name: str, fault: Fault) -> None:
        """Replace an instance's fault (Fault() switches every fault off)."""
        self._call(self.instance(instance_name).set_fault, fault)

    def clear_faults(self) -> None:
        for name in self.instances:
            self.set_fault(name, Fault())

    def restart(self, instance_name: str) -> None:
        """Simulate a process restart: open streams cut, counters reset."""
        self._call(self.instance(instance_name).restart)

    def requests(self, instance_name: str) -> list[dict[str, Any]]:
        """The emission timeline of the instance's finished requests (what /admin/requests returns)."""
        def snapshot() -> list[dict[str, Any]]:
            return [record_view(r) for r in self.instance(instance_name).records]
        result: list[dict[str, Any]] = self._call(snapshot)
        return result


@contextmanager
def running_fleet(spec: FleetSpec, start_timeout: float = 30.0,
                  emitter: str = "auto") -> Iterator[SimFleet]:
    """Run a SimFleet on a background thread's event loop for the duration of a `with` block."""
    fleet = SimFleet(spec, emitter=emitter)
    loop = new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sim-fleet", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(fleet.start(), loop).result(start_timeout)
        yield fleet
    finally:
        try:
            asyncio.run_coroutine_threadsafe(fleet.stop(), loop).result(start_timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(start_timeout)
            loop.close()
