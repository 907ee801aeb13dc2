"""Load generation across cores: SSE events per second with 1, 2, ... `--workers`, side by side in
one run against time-scaled simulators, and the client's stamp error with each.

    python benchmarks/bench_workers.py [--workers 1,2] [--replicas 1] [--pin] [--streams 256]
                                       [--requests 1024] [--time-scale 8] [--rounds 2] [--smoke]

The simulator serves seed-70b-h100's model as `--replicas` TP=4 replicas, each from its own
`crossover sim` process, faster than real time, so that one client process cannot read the events
as fast as they are written; the same closed-loop level then runs with each worker count in turn,
`--rounds` times. `--pin` gives the client (the sweep and its worker processes) the first cores,
as many as the most workers, and the simulators the rest, so that neither takes the other's turns.
Events per second: token events the client recorded / the level's traffic time (first send to last
end), for the machine as a whole; per client CPU-second: the same events / the CPU time of the
sweep and its worker processes, less what the same sweep costs with one short request per worker
(their start and imports): what one more core buys, whoever supplies the events. Stamp
error: each token's client stamp minus the time the simulator wrote it (`/admin/requests`,
matched by completion id), as in bench_loadgen.py; shared reads: the share of token events that came
in one socket read with another (their stamps are that read's, the last arrival's).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.loadgen; the package itself as installed
sys.path.append(str(REPO / "benchmarks"))

from bench_loadgen import _quantiles  # noqa: E402
from figures import add_smoke_flag, print_figures  # noqa: E402

from crossover.loadgen.plan import LengthDist, SweepPlan  # noqa: E402
from crossover.loadgen.sweep import Traffic, run_sweep  # noqa: E402
from crossover.netutil import free_port  # noqa: E402
from crossover.processes import cpu_seconds  # noqa: E402
from crossover.sim import fleet as sim_fleet  # noqa: E402
from crossover.spec import FleetSpec, load_spec, parse_spec  # noqa: E402
from tests.loadgen.loadgen_sim_process import emitted_by_id, sim_process, stamp_errors  # noqa: E402

TOPOLOGY = "tp4xN"


def _client_cpu_seconds() -> float:
    # this process and its reaped children: the worker pool's processes, joined when a sweep ends
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def replicated(spec: FleetSpec, replicas: int) -> FleetSpec:
    """The seed's tp4x1 as `replicas` TP=4 replicas of one topology, each on a free port."""
    data = spec.model_dump(mode="json")
    one = next(t for t in data["topologies"] if t["name"] == "tp4x1")
    instance = one["instances"][0]
    data["topologies"] = [{**one, "name": TOPOLOGY, "gpus": one["gpus"] * replicas,
                           "instances": [{**instance, "name": f"tp4-{i}", "url": f"http://127.0.0.1:{free_port()}"}
                                         for i in range(replicas)]}]
    return parse_spec(data, f"bench_workers' fleet ({replicas} replicas)")


def one_replica(spec: FleetSpec, index: int) -> FleetSpec:
    """The fleet one simulator process serves: replica `index` alone."""
    data = spec.model_dump(mode="json")
    topology = data["topologies"][0]
    data["topologies"] = [{**topology, "gpus": topology["gpus"] // len(topology["instances"]),
                           "instances": [topology["instances"][index]]}]
    return parse_spec(data, f"bench_workers' replica {index}")


def _start_cpu_seconds(spec: FleetSpec, plan: SweepPlan, workers: int, folder: Path) -> float:
    """What a sweep costs the client besides its traffic (worker processes' start, imports, the
    summary): the client CPU of the same sweep with one short request per worker."""
    tiny = replace(plan, levels=(workers,), requests_per_level=workers,
                   output_len=LengthDist.fixed(1))
    before = _client_cpu_seconds()
    run_sweep(spec, tiny, folder.with_name(folder.name + "-start"), [TOPOLOGY], n_boot=0,
              traffic=Traffic(workers=workers))
    return _client_cpu_seconds() - before


def one(spec: FleetSpec, plan: SweepPlan, workers: int, folder: Path,
        sim_pids: list[int]) -> dict[str, float]:
    sim_cpu = sum(sum(cpu_seconds(pid)) for pid in sim_pids)
    client_cpu = _client_cpu_seconds()
    started = time.monotonic()
    result = run_sweep(spec, plan, folder, [TOPOLOGY], n_boot=0, traffic=Traffic(workers=workers))
    wall = time.monotonic() - started
    sim_cpu = sum(sum(cpu_seconds(pid)) for pid in sim_pids) - sim_cpu
    client_cpu = _client_cpu_seconds() - client_cpu
    net_cpu = client_cpu - _start_cpu_seconds(spec, plan, workers, folder)
    # A run whose traffic costs less CPU than the start's own noise (a smoke's 512 requests against
    # two worker processes' imports) cannot be netted: its rate is over the whole sweep, a lower bound.
    start_included = net_cpu <= 0.2 * client_cpu
    if not start_included:
        client_cpu = net_cpu
    frame = result.requests
    stamps = stamp_errors(frame, emitted_by_id(spec, TOPOLOGY))
    events, first = stamps.events, stamps.first
    traffic = float(frame["end_time"].max() - frame["send_time"].min())
    first_q, itl_q = _quantiles(np.abs(first)), _quantiles(np.abs(stamps.itl))
    return {"workers": workers, "ok": int(frame["ok"].sum()), "requests": len(frame), "events": events,
            "traffic_s": traffic, "wall_s": wall, "events_per_s": events / traffic,
            "sim_cpu": sim_cpu / traffic, "events_per_client_cpu_s": events / client_cpu,
            "start_included": int(start_included),
            "shared": float(frame["shared_reads"].sum()) / events,
            "first_p50": first_q["p50_ms"], "first_p99": first_q["p99_ms"],
            "first_signed_p50": float(np.median(first) * 1000) if first.size else float("nan"),
            "itl_p50": itl_q["p50_ms"], "itl_p99": itl_q["p99_ms"]}


def cores(pin: bool, client: int, replicas: int) -> tuple[set[int] | None, set[int] | None]:
    """(the client's cores, the simulators' cores) when pinned and the machine has enough."""
    available = sorted(os.sched_getaffinity(0))
    if not pin:
        return None, None
    if len(available) <= client:
        sys.exit(f"--pin: {client} client cores leave none of this machine's {len(available)} "
                 f"for the simulators")
    return set(available[:client]), set(available[client:client + max(replicas, 1)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default=f"1,{len(os.sched_getaffinity(0))}",
                        help="worker counts to compare, comma-separated (default: 1 and the cores)")
    parser.add_argument("--replicas", type=int, default=1, help="TP=4 replicas, one simulator process each")
    parser.add_argument("--pin", action="store_true",
                        help="the client and the simulators on cores of their own")
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # 1 and 2 workers, one round of 512 requests of 32 tokens over 32 streams, one simulator
        args.workers, args.replicas, args.streams, args.requests, args.output_len, args.rounds = \
            "1,2", 1, 32, 512, 32, 1
    counts = sorted({int(w) for w in args.workers.split(",")})
    client_cpus, sim_cpus = cores(args.pin, max(counts), args.replicas)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)  # the worker processes inherit it
    base = sim_fleet.with_overrides(load_spec(REPO / "compose/specs/seed-70b-h100.yaml"),
                                    time_scale=args.time_scale)
    spec = replicated(base, args.replicas)
    plan = SweepPlan(levels=(args.streams,), requests_per_level=args.requests, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(args.output_len), timeout_s=300)
    print(f"load {os.getloadavg()[0]:.1f}; {os.cpu_count()} cores; client on {sorted(client_cpus or [])}, "
          f"{args.replicas} simulator(s) on {sorted(sim_cpus or [])}; {args.streams} streams, "
          f"{args.requests} requests of {args.output_len} tokens, simulator time_scale {args.time_scale:g}")
    print(f"{'workers':>7} {'ok':>6} {'events':>8} {'traffic s':>9} {'events/s':>9} {'/client CPU-s':>13} "
          f"{'sim CPU':>8} "
          f"{'shared reads':>12} {'first p50/p99 ms':>18} {'(signed p50)':>12} {'ITL p50/p99 ms':>16}")
    rows: dict[int, list[dict[str, float]]] = {w: [] for w in counts}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp, contextlib.ExitStack() as stack:
        sims = []
        for i in range(args.replicas):
            folder = Path(tmp) / f"sim-{i}"
            folder.mkdir()
            sims.append(stack.enter_context(sim_process(one_replica(spec, i), folder, args.time_scale,
                                                        cpus=sim_cpus)))
        for round_ in range(args.rounds):
            for workers in counts:
                row = one(spec, plan, workers, Path(tmp) / f"r{round_}-w{workers}", [s.pid for s in sims])
                rows[workers].append(row)
                print(f"{workers:>7} {row['ok']:>6} {row['events']:>8} {row['traffic_s']:>9.1f} "
                      f"{row['events_per_s']:>9.0f} {row['events_per_client_cpu_s']:>13.0f} "
                      f"{row['sim_cpu']:>7.0%} {row['shared']:>12.1%} "
                      f"{row['first_p50']:>8.3f}/{row['first_p99']:<8.3f} {row['first_signed_p50']:>12.3f} "
                      f"{row['itl_p50']:>7.3f}/{row['itl_p99']:<8.3f}")
                if row["start_included"]:
                    print("        per client CPU-s: over the whole sweep, the workers' start included "
                          "(the traffic's share is within the start's noise): a lower bound")
    scaling = {}
    for workers in counts[1:]:
        ratios = [b["events_per_s"] / a["events_per_s"] for a, b in zip(rows[1], rows[workers], strict=True)]
        scaling[str(workers)] = ratios
        print(f"events/s with {workers} workers / with 1, per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    print_figures({"levels": [row for workers in counts for row in rows[workers]],
                   "events_per_s_to_one_worker": scaling})
    return 0


if __name__ == "__main__":
    sys.exit(main())
