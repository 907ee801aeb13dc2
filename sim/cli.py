"""`crossover sim SPEC`: serve every instance of every topology of a spec until Ctrl-C or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import resource
import signal
import sys

from crossover.errors import UserError
from crossover.eventloop import LOOPS, loop_factory
from crossover.sim import fastpath, gcpolicy
from crossover.sim.fleet import SimFleet, with_overrides
from crossover.spec import load_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="fleet spec (YAML)")
    parser.add_argument("--seed", type=int, default=None, help="override simulator.seed")
    parser.add_argument("--vllm-version", default=None,
                        help="vLLM version whose metric names to expose (0.10/0.11 emit the legacy names)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="simulated seconds per wall second (default from the spec, 1.0)")
    parser.add_argument("--bind", default=None, metavar="HOST",
                        help="listen on HOST for every instance (e.g. 0.0.0.0 inside a container whose "
                        "URLs name services); default: each URL's own host, which must be loopback")
    parser.add_argument("--loop", choices=LOOPS, default="auto",
                        help="event loop: uvloop (auto: when installed, the faster one) or asyncio's own")
    parser.add_argument("--emitter", choices=fastpath.MODES, default="auto",
                        help="who writes streamed tokens: the emitter thread at each step's scheduled end "
                        "(auto: when built) or the event loop")
    parser.add_argument("--emitter-priority", choices=fastpath.PRIORITIES, default="realtime",
                        help="the emitter thread's scheduling: realtime (SCHED_FIFO at the lowest "
                        "priority, where the process may: root or CAP_SYS_NICE; else normal) or normal")
    parser.add_argument("--gc", default=gcpolicy.AUTO, metavar="N|freeze|auto",
                        help="garbage collector: a young collection every N allocations, or freeze: the "
                        "survivors of a young collection every 0.25 s are frozen out of every later one "
                        f"(sim/gcpolicy.py); auto (default): freeze with the emitter thread, else "
                        f"{gcpolicy.DEFAULT_YOUNG}")


async def serve(fleet: SimFleet) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await fleet.start()
    try:
        for line in fleet.lines():
            print(line, flush=True)
        await stop.wait()
    finally:
        await fleet.stop()


def raise_descriptor_limit() -> None:
    """Thousands of streams need thousands of descriptors (two each with the emitter thread), and many
    systems start processes with a soft limit of 1,024: raise it to the hard limit, as vLLM does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run(args: argparse.Namespace) -> int:
    try:
        gcpolicy.parse(args.gc)
    except ValueError:
        raise UserError(f"--gc must be a positive integer, {gcpolicy.FREEZE} or {gcpolicy.AUTO}, "
                        f"not {args.gc!r}") from None
    spec = with_overrides(load_spec(args.spec), seed=args.seed, vllm_version=args.vllm_version,
                          time_scale=args.time_scale)
    fleet = SimFleet(spec, bind_host=args.bind, emitter=args.emitter, emitter_priority=args.emitter_priority,
                     gc_policy=args.gc)
    raise_descriptor_limit()
    with asyncio.Runner(loop_factory=loop_factory(args.loop)) as runner:
        runner.run(serve(fleet))
    print("crossover sim: stopped", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m crossover.sim.cli SPEC`: the same as `crossover sim`, without the other subcommands."""

    parser = argparse.ArgumentParser(prog="crossover sim", description="serve a simulated vLLM fleet")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"crossover sim: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
