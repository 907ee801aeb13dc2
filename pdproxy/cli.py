"""`crossover pdproxy SPEC [--topology NAME] [--bind HOST]`: a topology's entrypoint, in front of real
vLLM servers.

Serves the topology's entrypoint URL (its port) and routes each request as vLLM's NixlConnector
expects: prefill instance with max_tokens=1 and kv_transfer_params {do_remote_decode: true}, then the
decode instance with the kv_transfer_params the prefill answered. The simulator serves the same
proxy in front of its simulated instances; the compose stack's `gpu-pd` profile runs this command
as the `pd-proxy` service.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from urllib.parse import urlsplit

from crossover.errors import UserError
from crossover.pdproxy.proxy import EntrypointProxy
from crossover.spec import FleetSpec, Topology, load_spec


def pd_topology(spec: FleetSpec, name: str | None) -> Topology:
    """The named topology, or the only disaggregated one; it must have an entrypoint URL."""
    if name is not None:
        topology = spec.topology(name)
    else:
        disaggregated = [t for t in spec.topologies if t.disaggregated]
        if len(disaggregated) != 1:
            raise UserError(f"give --topology: the spec has {len(disaggregated)} P/D topologies "
                            f"({[t.name for t in disaggregated]})")
        topology = disaggregated[0]
    if topology.entrypoint.url is None:
        raise UserError(f"topology {topology.name} has no entrypoint.url to serve")
    return topology


async def serve(proxy: EntrypointProxy) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await proxy.start()
    except OSError as exc:
        await proxy.stop()
        raise UserError(f"cannot listen on {proxy.host}:{proxy.port}: {exc.strerror or exc}") from None
    if proxy.topology.disaggregated:
        upstream = f"prefill {proxy.prefill}, decode {proxy.decode}"
    else:
        upstream = f"round robin over {proxy.decode}"
    print(f"entrypoint of {proxy.topology.name} on http://{proxy.host}:{proxy.port} -> {upstream}",
          flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.stop()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="fleet spec (YAML)")
    parser.add_argument("--topology", default=None,
                        help="the topology whose entrypoint to serve (default: the only P/D one)")
    parser.add_argument("--bind", default=None, metavar="HOST",
                        help="listen here instead of the entrypoint URL's host (0.0.0.0 in a container)")


def run(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    proxy = EntrypointProxy(pd_topology(spec, args.topology), spec.model.name)
    proxy.host = args.bind or urlsplit(proxy.url).hostname or "127.0.0.1"
    asyncio.run(serve(proxy))
    return 0
