"""Load generation across cores: SSE events per second with 1 and N `--workers`, side by side in one
run against one time-scaled simulator, and the client's stamp error with each.

    python benchmarks/bench_workers.py [--workers 2] [--streams 256] [--requests 1024] [--time-scale 8]
                                       [--rounds 2]

The simulator (`crossover sim`, its own process) serves seed-70b-h100's `tp4x1` faster than real
time, so that one client process cannot read the events as fast as they are written; the same
closed-loop level then runs with 1 and with N worker processes, alternating, `--rounds` times.
Events per second: token events the client recorded / the level's traffic time (first send to last
end), for the machine as a whole. Stamp error: each token's client stamp minus the time the
simulator wrote it (`/admin/requests`, matched by completion id), as in bench_loadgen.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.loadgen; the package itself as installed
sys.path.append(str(REPO / "benchmarks"))

from bench_loadgen import _all_emitted, _quantiles  # noqa: E402

from crossover.loadgen.plan import LengthDist, SweepPlan  # noqa: E402
from crossover.loadgen.sweep import Traffic, run_sweep  # noqa: E402
from crossover.netutil import spec_on_free_ports  # noqa: E402
from crossover.sim import fleet as sim_fleet  # noqa: E402
from crossover.spec import FleetSpec, load_spec  # noqa: E402
from tests.loadgen.loadgen_sim_process import sim_process  # noqa: E402

TOPOLOGY = "tp4x1"


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one(spec: FleetSpec, plan: SweepPlan, workers: int, folder: Path, sim_pid: int) -> dict[str, float]:
    sim_cpu = _cpu_seconds(sim_pid)
    started = time.monotonic()
    result = run_sweep(spec, plan, folder, [TOPOLOGY], n_boot=0, traffic=Traffic(workers=workers))
    wall = time.monotonic() - started
    sim_cpu = _cpu_seconds(sim_pid) - sim_cpu
    frame = result.requests
    served = {r["id"]: r for r in _all_emitted(spec, TOPOLOGY)}
    first, itl = [], []
    events = 0
    for _, row in frame.iterrows():
        record = served.get(row["completion_id"])
        stamped = row["send_time"] + np.asarray(row["chunk_times"])
        events += len(stamped)
        if not row["ok"] or record is None or len(stamped) != len(record["token_times"]):
            continue
        server = np.asarray(record["token_times"])
        first.append(stamped[0] - server[0])
        itl.extend(np.diff(stamped) - np.diff(server))
    traffic = float(frame["end_time"].max() - frame["send_time"].min())
    return {"workers": workers, "ok": int(frame["ok"].sum()), "requests": len(frame), "events": events,
            "traffic_s": traffic, "wall_s": wall, "events_per_s": events / traffic,
            "sim_cpu_share": sim_cpu / traffic,
            "first_p50": _quantiles(np.abs(np.asarray(first)))["p50_ms"],
            "first_p99": _quantiles(np.abs(np.asarray(first)))["p99_ms"],
            "itl_p50": _quantiles(np.abs(np.asarray(itl)))["p50_ms"],
            "itl_p99": _quantiles(np.abs(np.asarray(itl)))["p99_ms"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--requests", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    spec = sim_fleet.with_overrides(spec_on_free_ports(load_spec(REPO / "compose/specs/seed-70b-h100.yaml")),
                                    time_scale=args.time_scale)
    spec = spec.model_copy(update={"topologies": [spec.topology(TOPOLOGY)]})
    plan = SweepPlan(levels=(args.streams,), requests_per_level=args.requests, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(args.output_len), timeout_s=300)
    print(f"load {os.getloadavg()[0]:.1f}; {args.streams} streams, {args.requests} requests of "
          f"{args.output_len} tokens, simulator time_scale {args.time_scale:g}")
    print(f"{'workers':>7} {'ok':>6} {'events':>8} {'traffic s':>9} {'events/s':>9} {'sim CPU':>8} "
          f"{'first p50/p99 ms':>18} {'ITL p50/p99 ms':>16}")
    rows: dict[int, list[dict[str, float]]] = {1: [], args.workers: []}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp, \
            sim_process(spec, Path(tmp), args.time_scale) as sim:
        for round_ in range(args.rounds):
            for workers in (1, args.workers):
                row = one(spec, plan, workers, Path(tmp) / f"r{round_}-w{workers}", sim.pid)
                rows[workers].append(row)
                print(f"{workers:>7} {row['ok']:>6} {row['events']:>8} {row['traffic_s']:>9.1f} "
                      f"{row['events_per_s']:>9.0f} {row['sim_cpu_share']:>7.0%} "
                      f"{row['first_p50']:>8.3f}/{row['first_p99']:<8.3f} "
                      f"{row['itl_p50']:>7.3f}/{row['itl_p99']:<8.3f}")
    ratios = [b["events_per_s"] / a["events_per_s"] for a, b in zip(rows[1], rows[args.workers], strict=True)]
    print(f"events/s with {args.workers} workers / with 1, per round: "
          f"{', '.join(f'{r:.2f}' for r in ratios)}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
