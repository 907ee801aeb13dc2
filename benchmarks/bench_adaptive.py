"""Adaptive sweep vs the full fixed grid, side by side in one run against the simulator.

    python benchmarks/bench_adaptive.py [--preset seed|pd|both] [--time-scale-seed 0.25] [--time-scale-pd 5]
                                        [--seed 1] [--pd-seconds 400] [--model-seeds N] [--smoke]

For each preset the fixed grid runs first; the width of its crossing interval (relative to the
estimate; the interval spans the bootstrap's and the measured levels either side of the estimate,
as the adaptive sweep's does) becomes the adaptive sweep's --target-ci, over the same range, so the
two reach the same width and the table compares what it cost: requests, traffic seconds and wall
time. The simulator's
ground truth (crossover.sim.truth, the same model in virtual time) must lie inside both intervals;
the table also shows each sweep's bracket (the measured levels either side of its estimate that
bound it), which the adaptive sweep narrows to --target-ci, and whose end levels it confirms with
repeats (fresh seeds, two that agree by default: "(x2)" after a level) before it accepts a
crossing; a level whose repeats disagree bounds nothing, and the bracket reaches past it.

- seed: compose/specs/seed-70b-h100.yaml, closed loop (concurrency 1-64, doubling, 4 rounds a
  level), the crossing of output tokens/s per GPU (tp2x2 overtakes tp4x1); truth:
  truth.ground_truth_crossover.
- pd: compose/specs/pd-8k-prompts.yaml, open loop (request rates in steps of 0.1 req/s of
  simulated time, each level --pd-seconds simulated seconds of arrivals), the crossing of p99 ITL (P/D
  keeps it flat once 8K-token prompts stall the colocated replicas' decodes); truth: the crossing
  of truth.open_loop's long-run p99 ITL curves, bisected on the rate for each of five
  4000-request arrival sequences, their median (one 1000-request sequence puts it anywhere in
  1.11-1.29 at the default time scale: a single draw would tip the verdicts near it). Near the
  step one level reads the jump or not by its arrival sequence, so the pd report adds, on the
  model: the share of the sweep's own sequences (seeds 1-20) that read it at rates about the
  step, the rates at which this seed's do, and each measured level replayed at its own send
  times (truth.replay) beside its live read, which tells the simulator's error from the
  sequence's draw.
A live P/D run takes about 40 minutes a seed; --model-seeds N runs the same two sweeps for N seeds
from --seed on with each level read from the model at the send times the sweep draws for it (model_levels),
a minute a seed, and counts the seeds that meet the goal: many arrival sequences where the live
runs afford a few (it reproduces the live runs' levels and answers seed for seed).
Open-loop rates are wall-clock: the simulator at time_scale s serves rate r of simulated time when
sent r x s requests per wall second, so the pd levels and its truth are scaled by s.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.loadgen; the package itself as installed

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from figures import add_smoke_flag, print_figures, skipped  # noqa: E402

from crossover import slo  # noqa: E402
from crossover.loadgen import sweep as sweep_module  # noqa: E402
from crossover.loadgen.analysis import summary  # noqa: E402
from crossover.loadgen.analysis.adaptive import AdaptivePlan, Interval, intervals  # noqa: E402
from crossover.loadgen.plan import LengthDist, Mode, SweepPlan  # noqa: E402
from crossover.loadgen.sweep import SweepResult, run_sweep  # noqa: E402
from crossover.loadgen.traffic.client import RequestRecord, StreamTrace, build_record  # noqa: E402
from crossover.loadgen.traffic.dataset import arrival_offsets  # noqa: E402
from crossover.netutil import spec_on_free_ports  # noqa: E402
from crossover.sim import fleet as sim_fleet  # noqa: E402
from crossover.sim import truth  # noqa: E402
from crossover.spec import FleetSpec, load_spec  # noqa: E402
from tests.loadgen.loadgen_sim_process import sim_process  # noqa: E402

N_BOOT = 200


@dataclass(frozen=True)
class Preset:
    spec: str
    pair: tuple[str, str]
    metric: str
    plan: Callable[[float], SweepPlan]  # time scale -> the fixed grid's plan
    truth: Callable[[FleetSpec, SweepPlan, float], float]  # the crossing, in the plan's level units


SEED_IN, SEED_OUT = 128, 16
PD_IN, PD_OUT = 8192, 256
PD_RATES = tuple(round(0.1 * k, 1) for k in range(1, 9))  # simulated req/s
# Simulated seconds of arrivals per level: 40 requests at 0.1 req/s, 320 at 0.8. A level must be long
# enough to hold the long-run tail: 100-s levels read the p99 ITL jump only when a stall lands in
# their own 1% tail, which places the median crossing well above the long-run one.
PD_SECONDS = 400.0


def _seed_plan(scale: float) -> SweepPlan:
    # Clients start spread over about one request's life and the first moments are trimmed, as the
    # ground truth staggers its clients and skips its warm-up (tests/loadgen/test_loadgen_sim.py).
    return SweepPlan(levels=(1, 2, 4, 8, 16, 32, 64), rounds=4, ramp_s=0.1 / scale,
                     warmup_s=0.125 / scale, input_len=LengthDist.fixed(SEED_IN),
                     output_len=LengthDist.fixed(SEED_OUT), timeout_s=120, seed=1)


def _seed_truth(spec: FleetSpec, plan: SweepPlan, scale: float) -> float:
    found = truth.ground_truth_crossover(spec, "tp4x1", "tp2x2", SEED_IN, SEED_OUT,
                                         [int(x) for x in plan.levels])
    assert found is not None
    return found


def _pd_plan(scale: float) -> SweepPlan:
    # Each level runs for the same simulated time (rate x duration requests, as `--duration` does):
    # a level costs requests in proportion to its rate, like GPU time on a real fleet.
    return SweepPlan(mode=Mode.OPEN, levels=tuple(round(r * scale, 6) for r in PD_RATES),
                     duration_s=PD_SECONDS / scale,
                     input_len=LengthDist.fixed(PD_IN), output_len=LengthDist.fixed(PD_OUT), timeout_s=300,
                     seed=1)


def _pd_truth(spec: FleetSpec, plan: SweepPlan, scale: float, requests: int = 4000, seeds: int = 5) -> float:
    """Where colocated's p99 ITL rises above pd1p1d's in the long run: for each of `seeds` arrival
    sequences of `requests` requests, bisected on the simulated rate; their median."""
    def crossing(seed: int) -> float:
        def lead(rate: float) -> float:
            p99 = [truth.open_loop(spec, name, rate, PD_IN, PD_OUT, requests, seed=seed).itl_quantile(0.99)
                   for name in ("colocated", "pd1p1d")]
            return p99[0] - p99[1]

        low, high = PD_RATES[0], PD_RATES[-1]
        assert lead(low) < 0 < lead(high)
        while high - low > 0.002:
            middle = (low + high) / 2
            low, high = (middle, high) if lead(middle) < 0 else (low, middle)
        return (low + high) / 2

    return float(np.median([crossing(seed) for seed in range(1, seeds + 1)])) * scale


def _sends(plan: SweepPlan, rate: float, seconds: float, scale: float, seed: int) -> list[float]:
    """The simulated send times of one level of the sweep at wall-clock `rate` with `seed`: the
    sweep's own arrival sequence (rate x seconds requests, as `--duration` sends)."""
    n = round(rate / scale * seconds)
    return list(arrival_offsets(replace(plan, seed=seed), rate, n) * scale)


def _jump(spec: FleetSpec, sends: list[float]) -> bool:
    colocated, pd1p1d = (truth.replay(spec, name, sends, PD_IN, PD_OUT).itl_quantile(0.99)
                         for name in ("colocated", "pd1p1d"))
    return bool(colocated > pd1p1d)


def pd_level_reads(spec: FleetSpec, plan: SweepPlan, scale: float, seconds: float,
                   seeds: int = 20) -> list[tuple[float, float, bool]]:
    """(wall-clock rate, share of seeds 1-`seeds`, whether the plan's own seed does) for which one
    level as long as the sweep's, with the sweep's own arrival sequence, reads colocated's p99 ITL
    above pd1p1d's on the simulator's model: the jump is a probability in a level (its 1% tail
    holds a stall or not), so this band, not the long-run truth alone, says how closely any sweep
    of such levels can place the crossing."""
    found = []
    for rate in (0.2, 0.22, 0.246, 0.26, 0.282, 0.3, 0.32):  # simulated req/s, about the step
        wall = rate * scale
        above = sum(_jump(spec, _sends(plan, wall, seconds, scale, s)) for s in range(1, seeds + 1))
        found.append((wall, above / seeds, _jump(spec, _sends(plan, wall, seconds, scale, plan.seed))))
    return found


def _p99(itls: np.ndarray) -> float:
    """The tail quantile as the sweep's summary takes it, so a live read and the model's compare."""
    return summary.percentile(itls, slo.TAIL_QUANTILE)


def model_replay(spec: FleetSpec, frame: pd.DataFrame, pair: tuple[str, str],
                 scale: float) -> tuple[int, int, float]:
    """Every measured level (each repeat apart) fed through the simulator's model at its own send
    times: at how many of how many the model reads the same side of the crossing (the first
    topology's p99 ITL above the second's or not) as the live level, and the largest gap between a
    live p99 ITL and the model's (seconds of simulated time)."""
    agree, total, gap = 0, 0, 0.0
    for _, level in frame.groupby(["level", "repeat"]):
        if not set(pair) <= set(level["topology"]):
            continue
        live, model = [], []
        for name in pair:
            rows = level[level["topology"] == name]
            live.append(_p99(summary.latency_samples(rows, "itl") * scale))
            sends = sorted((rows["send_time"] - level["send_time"].min()) * scale)
            traces = truth.replay(spec, name, sends, PD_IN, PD_OUT).traces
            model.append(_p99(np.array([x for t in traces for x in t.itls])))
            gap = max(gap, abs(live[-1] - model[-1]))
        total += 1
        agree += (live[0] > live[1]) == (model[0] > model[1])
    return agree, total, gap


@contextlib.contextmanager
def model_levels(spec: FleetSpec, scale: float) -> Iterator[None]:
    """Every sweep level read from the simulator's model (truth.replay) at the send times the sweep
    draws for it, instead of sent to the simulator: the same plans, seeds, analysis and decisions,
    at a second of CPU a level, so many arrival sequences can be tried. It replaces the sweep's one
    measuring step (a private method: a benchmark's seam, not a user's)."""
    async def records(self: Any, name: str, level: float,
                      plan: SweepPlan) -> tuple[list[RequestRecord], None]:
        prepared = list(self._prepared(level, plan))
        sends = arrival_offsets(plan, level / plan.turns, len(prepared)) * scale  # as the sweep's _open
        traces = truth.replay(spec, name, list(sends), PD_IN, PD_OUT).traces
        start = time.time()
        found = []
        for (request, _), t in zip(prepared, traces, strict=True):
            stamps = [start + x / scale for x in t.token_times]
            trace = StreamTrace(start + t.arrival / scale, chunk_times=stamps, chunk_tokens=[1] * len(stamps),
                                usage_prompt_tokens=request.input_len, usage_completion_tokens=len(stamps),
                                status=200, done=True, end_time=stamps[-1])
            found.append(build_record(trace, request, name, level, "model"))
        return found, None

    with mock.patch.object(sweep_module._Sweep, "_records", records):
        yield


PRESETS = {
    "seed": Preset("compose/specs/seed-70b-h100.yaml", ("tp4x1", "tp2x2"), "output_tps", _seed_plan,
                   _seed_truth),
    "pd": Preset("compose/specs/pd-8k-prompts.yaml", ("colocated", "pd1p1d"), "itl_p99", _pd_plan, _pd_truth),
}


_TRUTHS: dict[tuple[str, float], float] = {}


@dataclass
class Outcome:
    requests: int
    traffic_s: float
    wall_s: float
    levels: list[float]
    interval: Interval | None
    stop_reason: str
    repeats: dict[float, int]  # measurements of each level (1 unless repeated)
    order: list[float]  # the levels in the order they were first measured
    records: pd.DataFrame  # the sweep's request records


def _crossing(result: SweepResult, adaptive: AdaptivePlan) -> Interval | None:
    found = intervals(result.crossover, adaptive)
    return max(found, key=lambda i: i.width) if found else None


def _run(spec: FleetSpec, plan: SweepPlan, folder: Path, pair: tuple[str, str], adaptive: AdaptivePlan,
         search: bool) -> Outcome:
    started = time.monotonic()
    result = run_sweep(spec, plan, folder, list(pair), n_boot=N_BOOT, adaptive=adaptive if search else None)
    wall = time.monotonic() - started
    frame = result.requests
    traffic = float(frame.groupby(["topology", "level", "repeat"]).apply(
        lambda g: g["end_time"].max() - g["send_time"].min()).sum())
    levels = sorted(set(frame["level"]))
    most = frame.groupby("level")["repeat"].max()
    repeats = {float(x): int(most[x]) for x in levels}
    adaptive_state = result.crossover.adaptive
    order = [float(x) for x in (adaptive_state.levels if adaptive_state is not None else levels)]
    return Outcome(len(frame), traffic, wall, levels, _crossing(result, adaptive), result.stop_reason,
                   repeats, order, frame)


def bench(name: str, scale: float, folder: Path, seed: int = 1,
          pd_seconds: float = PD_SECONDS, model: bool = False) -> dict[str, Any]:
    preset = PRESETS[name]
    spec = sim_fleet.with_overrides(spec_on_free_ports(load_spec(REPO / preset.spec)), time_scale=scale)
    plan = replace(preset.plan(scale), seed=seed)  # the arrival times and prompts of both sweeps
    if name == "pd":
        plan = replace(plan, duration_s=pd_seconds / scale)
    if (name, scale) not in _TRUTHS:  # independent of the sweeps' seed: computed once a run
        _TRUTHS[name, scale] = preset.truth(spec, plan, scale)
    true_x = _TRUTHS[name, scale]
    crossing_only = AdaptivePlan(metric=preset.metric, answers=("crossing",))
    folder.mkdir(parents=True)
    reads = model_levels(spec, scale) if model else contextlib.nullcontext()
    with sim_process(spec, folder, scale), reads:
        grid = _run(spec, plan, folder / "grid", preset.pair, crossing_only, search=False)
        if grid.interval is None or grid.interval.low is None:
            raise SystemExit(f"{name}: the fixed grid found no crossing interval of {preset.metric}")
        target = min(0.99, grid.interval.width)
        search_plan = replace(plan, levels=(plan.levels[0], plan.levels[-1]))
        adaptive = AdaptivePlan(target_ci=target, metric=preset.metric, answers=("crossing",))
        found = _run(spec, search_plan, folder / "adaptive", preset.pair, adaptive, search=True)
    pd_extra: dict[str, Any] = {}
    if name == "pd" and not model:
        pd_extra = {"level_reads": pd_level_reads(spec, plan, scale, pd_seconds),
                    "replay": [model_replay(spec, o.records, preset.pair, scale) for o in (grid, found)]}
    return {"preset": name, "scale": scale, "seed": seed, "truth": true_x, "grid": grid, "adaptive": found,
            "target": target, "pd_seconds": pd_seconds, **pd_extra}


def _inside(interval: Interval | None, x: float) -> str:
    if interval is None or interval.low is None or interval.high is None:
        return "no interval"
    return "yes" if interval.low <= x <= interval.high else "NO"


def _bracket(o: Outcome, x: float) -> str:
    """The measured levels either side of the estimate, and whether the truth lies between them
    (a jump between two levels is invisible to the bootstrap interval, never to the bracket)."""
    found = o.interval.ends(o.levels) if o.interval is not None else None
    if found is None:
        return "-"
    return f"{found[0]:.3g}-{found[1]:.3g} ({'yes' if found[0] <= x <= found[1] else 'NO'})"


def report(row: dict[str, Any]) -> None:
    grid, found, x = row["grid"], row["adaptive"], row["truth"]
    print(f"\n== {row['preset']} (time_scale {row['scale']:g}, seed {row['seed']}); ground truth crossing at "
          f"{x:.3g}; target width {row['target']:.1%}")
    print(f"{'sweep':<10}{'levels':>8}{'requests':>10}{'traffic s':>11}{'wall s':>9}   crossing (interval)"
          f"        width   truth inside   bracket (truth inside)   stop")
    for label, o in (("grid", grid), ("adaptive", found)):
        i = o.interval
        bounded = i is not None and i.low is not None and i.high is not None
        ci = f"{i.x:.3g} ({i.low:.3g}-{i.high:.3g})" if bounded and i is not None else "-"
        width = f"{i.width:.1%}" if i else "-"
        print(f"{label:<10}{len(o.levels):>8}{o.requests:>10}{o.traffic_s:>11.1f}{o.wall_s:>9.1f}   {ci:<24}"
              f"{width:>7}   {_inside(i, x):<13}  {_bracket(o, x):<24} {o.stop_reason or '-'}")
    if row["preset"] == "pd":
        reads = ", ".join(f"{rate:.3g}: {share:.0%}" for rate, share, _ in row["level_reads"])
        print(f"one {row['pd_seconds']:g}-s level of the sweep's own arrivals reads colocated above pd1p1d "
              f"on the model (share of seeds 1-20) at rate {reads}")
        own = ", ".join(f"{rate:.3g}" for rate, _, mine in row["level_reads"] if mine) or "none"
        print(f"this run's seed {row['seed']} reads it on the model at rate {own}")
        for label, (agree, total, gap) in zip(("grid", "adaptive"), row["replay"], strict=True):
            print(f"{label}: the model fed each level's own send times reads the live side at {agree} of "
                  f"{total} levels; p99 ITL within {gap * 1e3:.1f} ms of the live one (simulated time)")
    print(f"adaptive / grid: requests {found.requests / grid.requests:.2f}, traffic time "
          f"{found.traffic_s / grid.traffic_s:.2f}, wall time {found.wall_s / grid.wall_s:.2f}; "
          f"adaptive levels {_levels(found)}")


def met(row: dict[str, Any]) -> bool:
    """The goal: the adaptive sweep reaches the grid's width with at most half its requests, and the
    truth lies inside both intervals and the adaptive sweep's bracket."""
    grid, found, x = row["grid"], row["adaptive"], row["truth"]
    found_bracket = found.interval.ends(found.levels) if found.interval is not None else None
    return (found.requests <= grid.requests / 2 and found.interval is not None
            and found.interval.width <= row["target"] and _inside(grid.interval, x) == "yes"
            and _inside(found.interval, x) == "yes" and found_bracket is not None
            and found_bracket[0] <= x <= found_bracket[1])


def model_report(rows: list[dict[str, Any]]) -> None:
    """One line a seed of the model-read sweeps, then how many meet the goal."""
    print(f"\n== pd on the model (time_scale {rows[0]['scale']:g}, {rows[0]['pd_seconds']:g}-s levels); "
          f"ground truth crossing at {rows[0]['truth']:.3g}")
    print(f"{'seed':>4}  {'grid interval':<22}{'adaptive interval':<22}{'bracket':<16}{'requests':>9}"
          f"   met   adaptive levels")
    for row in rows:
        grid, found, x = row["grid"], row["adaptive"], row["truth"]
        cells = []
        for i in (grid.interval, found.interval):
            bounded = i is not None and i.low is not None and i.high is not None
            cells.append(f"{i.low:.3g}-{i.high:.3g} ({_inside(i, x)})" if bounded and i is not None else "-")
        print(f"{row['seed']:>4}  {cells[0]:<22}{cells[1]:<22}{_bracket(found, x):<16}"
              f"{found.requests / grid.requests:>9.2f}   {'yes' if met(row) else 'NO':<5} {_levels(found)}")
    print(f"met on {sum(met(r) for r in rows)} of {len(rows)} seeds")


def row_figures(row: dict[str, Any]) -> dict[str, Any]:
    """One preset's figures, for the `figures:` line: each sweep's cost and answer, and the ratios."""
    x = row["truth"]
    out: dict[str, Any] = {"truth": x, "target_width": row["target"], "met": int(met(row))}
    for label in ("grid", "adaptive"):
        o: Outcome = row[label]
        i = o.interval
        found = i.ends(o.levels) if i is not None else None
        out[label] = {"levels": len(o.levels), "requests": o.requests, "traffic_s": o.traffic_s,
                      "wall_s": o.wall_s, "crossing": i.x if i else None, "low": i.low if i else None,
                      "high": i.high if i else None, "width": i.width if i else None,
                      "truth_inside": int(_inside(i, x) == "yes"),
                      "bracket_truth_inside": int(found is not None and found[0] <= x <= found[1])}
    for what in ("requests", "traffic_s", "wall_s"):
        out[f"{what}_ratio"] = getattr(row["adaptive"], what) / getattr(row["grid"], what)
    return out


def _levels(o: Outcome) -> str:
    return ", ".join(f"{v:g}" + (f" (x{o.repeats[v]})" if o.repeats.get(v, 1) > 1 else "") for v in o.order)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=["seed", "pd", "both"], default="both")
    parser.add_argument("--time-scale-seed", type=float, default=0.25)
    parser.add_argument("--time-scale-pd", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1,
                        help="the sweeps' seed: the simulator is deterministic, so a rerun with the same "
                             "seed sends the same arrivals and reads the same levels; another seed "
                             "samples another arrival sequence")
    parser.add_argument("--pd-seconds", type=float, default=PD_SECONDS,
                        help="simulated seconds of arrivals per P/D level (default %(default)g)")
    parser.add_argument("--model-seeds", type=int, default=0,
                        help="instead of the live runs: the pd preset's two sweeps for N seeds (from "
                             "--seed on) with every level read from the simulator's model at the sweep's "
                             "own send times, and how many seeds meet the goal")
    add_smoke_flag(parser)
    args = parser.parse_args()
    live = ["seed", "pd"] if args.preset == "both" else [args.preset]
    if args.smoke:
        # The seed preset live in real time (4x its default), levels 1, 4, 16 and 64 of 2 rounds, a
        # 50-resample bootstrap; the P/D preset on the model (--model-seeds 1) with 100-s levels and its
        # truth from one 300-request arrival sequence. The P/D preset's live crossing is a step of a tail
        # quantile that a loaded machine's timing noise hides at sizes that run in seconds.
        global N_BOOT
        N_BOOT = 50
        PRESETS["seed"] = replace(PRESETS["seed"], plan=lambda scale: replace(
            _seed_plan(scale), levels=(1, 4, 16, 64), rounds=2))
        PRESETS["pd"] = replace(PRESETS["pd"], truth=partial(_pd_truth, requests=300, seeds=1))
        args.time_scale_seed, args.pd_seconds, args.model_seeds, live = 1.0, 100.0, 1, ["seed"]
        skipped("the P/D preset live (a 40-minute run): its sweeps run on the model (--model-seeds 1)")
    elif args.model_seeds:
        live = []
    if not args.pd_seconds > 0:
        parser.error(f"--pd-seconds: must be a positive number of seconds, got {args.pd_seconds:g}")
    if args.model_seeds < 0:
        parser.error(f"--model-seeds: must be a whole number of at least 0, got {args.model_seeds}")
    found: dict[str, Any] = {}
    scales = {"seed": args.time_scale_seed, "pd": args.time_scale_pd}
    with tempfile.TemporaryDirectory(prefix="bench-adaptive-") as tmp:
        for name in live:
            row = bench(name, scales[name], Path(tmp) / name, args.seed, args.pd_seconds)
            report(row)
            found[name] = row_figures(row)
        if args.model_seeds:
            rows = [bench("pd", args.time_scale_pd, Path(tmp) / str(seed), seed, args.pd_seconds, model=True)
                    for seed in range(args.seed, args.seed + args.model_seeds)]
            model_report(rows)
            found["pd_model"] = {"seeds": len(rows), "met": sum(met(r) for r in rows),
                                 "by_seed": {str(r["seed"]): row_figures(r) for r in rows}}
    print_figures(found)
    return 0


if __name__ == "__main__":
    sys.exit(main())
