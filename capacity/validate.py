"""`crossover capacity --validate`: the top layouts on the live simulator (crossover.sim.fleet) with
the real sweep (crossover.loadgen), predicted against measured capacity and goodput per GPU.

Each layout gets its own sweep of levels around its predicted capacity (0.8, 1 and 1.25 times it;
open loop, the planner's two bracket levels in place of the middle one, each sent as the planner
drew it: Workload.open_sweep), as many requests per level as the prediction counted; the sweep's
own analysis (loadgen.crossings.max_load_meeting_objective, in its crossover.json) gives the
measured capacity, and its summary the measured goodput per GPU at the predicted capacity's level
(open loop: the bracket's lower level, the highest that met the objective).
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover import slo
from crossover.capacity.evaluate import measure, open_counts
from crossover.capacity.output import Plan, fleet_spec
from crossover.capacity.search import LayoutResult, label
from crossover.loadgen.analysis.crossings import format_load
from crossover.loadgen.analysis.summary import per_gpu
from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist, Mode, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import running_fleet
from crossover.spec import FleetSpec, parse_spec

LEVEL_FACTORS = (0.8, 1.0, 1.25)  # the levels swept, as shares of the predicted capacity
GOAL = 0.10  # predicted within 10% of measured


@dataclass(frozen=True)
class Check:
    layout: str
    level: float  # the predicted capacity's level, as swept
    predicted_capacity: float
    band: tuple[float | None, float | None]
    measured_capacity: float | None
    measured_censored: str
    predicted_goodput_per_gpu: float  # at `level`, on the ground truth
    measured_goodput_per_gpu: float  # at `level`, live

    @property
    def capacity_error(self) -> float | None:
        if self.measured_capacity is None or not self.measured_capacity > 0:
            return None
        return self.predicted_capacity / self.measured_capacity - 1

    @property
    def goodput_error(self) -> float | None:
        if not self.measured_goodput_per_gpu > 0:
            return None
        return self.predicted_goodput_per_gpu / self.measured_goodput_per_gpu - 1


def _level(x: float, mode: Mode) -> float:
    return float(max(1, round(x))) if mode is Mode.CLOSED else float(f"{x:.3g}")


def check_layout(plan: Plan, spec: FleetSpec, result: LayoutResult, folder: Path) -> Check:
    """One layout swept live around its predicted capacity."""
    assert result.capacity.load is not None
    mode, workload = plan.mode, plan.workload
    profile = next(p for p in plan.profiles if p.name == result.profile)
    fleet = spec_on_free_ports(parse_spec(fleet_spec(spec, profile, [result.layout]), "validation spec"))
    name = result.layout.name
    topology = result.layout.topology()
    on_profile = profile.apply(spec)
    centre = _level(result.capacity.load, mode)
    levels = tuple(sorted({_level(result.capacity.load * f, mode) for f in LEVEL_FACTORS} | {centre}))
    if mode is Mode.OPEN and result.capacity.low is not None and result.capacity.high is not None:
        # The levels the planner bracketed its capacity with, swept with the arrivals it drew there
        # (Workload.open_sweep): its attainment steps from 1 to well below the objective within a
        # few % of load, so on the factors' levels alone the sweep's interpolation reads the
        # capacity near the level below the step, up to 20% off, whatever the fleet does.
        centre = result.capacity.low  # the highest level that met the objective
        outer = {_level(result.capacity.load * f, mode) for f in (LEVEL_FACTORS[0], LEVEL_FACTORS[-1])}
        levels = tuple(sorted(outer | {result.capacity.low, result.capacity.high}))
    common: dict[str, Any] = {
        "input_len": LengthDist.fixed(workload.input_len),
        "output_len": LengthDist.fixed(workload.output_len),
        "slos_ms": dict(plan.slos_ms),
        "objective": plan.objective,
        "timeout_s": 600.0,
    }
    if workload.source:
        # The live sweep sends the file itself: its prompts, counted by the simulator's /tokenize.
        common |= {
            "dataset": DatasetKind(workload.dataset),
            "dataset_path": workload.source,
            "endpoint": Endpoint(workload.endpoint),
            "tokenizer": workload.tokenizer,
            "turns": workload.turns,  # every turn of the conversations, as the prediction sent them
            "think_time_s": workload.think_time_s,
        }
    # Open loop, the sweep's level is requests/s and its conversations arrive at level / turns
    # (loadgen/sweep.py); the prediction's rate is conversations/s: the sweep runs ours x turns.
    per = workload.turns if mode is Mode.OPEN else 1
    if mode is Mode.CLOSED:
        # As the ground truth's closed loop: two rounds of warm-up, then the counted requests (at
        # least four rounds); a round lasts about concurrency / predicted requests per second.
        top = max(levels)
        at = result.capacity.at
        # (rounds of conversations with several turns, as the ground truth's warm-up)
        warm = 2 * workload.mean_turns
        warmup = warm * top / at.goodput_rps if at is not None and at.goodput_rps > 0 else 0.0
        rounds = warm + max(4.0, workload.requests / top)
        sweep_plan = SweepPlan(mode=mode, levels=levels, rounds=rounds, warmup_s=warmup, seed=workload.seed,
                               **common)
    elif workload.multi_turn:
        warmup, conversations = max(
            open_counts(on_profile, topology, workload, level, plan.slos_ms) for level in levels
        )
        # The ground truth leaves out its first arrivals (evaluate.open_counts); so does the sweep.
        sweep_plan = SweepPlan(
            mode=mode,
            levels=tuple(level * per for level in levels),
            requests_per_level=(warmup + conversations) * per,
            warmup_s=warmup / max(levels),
            **common,
        )
    else:
        # The ground truth's own sweep: its arrivals and counts at every level. It leaves out its
        # first arrivals (evaluate.WARMUP_SHARE); the sweep, those sent in as long at the centre (the
        # same ones but for a few, which meet an empty fleet either way).
        sweep_plan = workload.open_sweep(
            levels, warmup_s=(workload.open_sent(centre) - workload.open_requests(centre)) / centre, **common
        )
    with running_fleet(fleet):
        outcome = run_sweep(fleet, sweep_plan, folder / name, [name], n_boot=0)
    capacity = next(c for c in outcome.crossover.capacities if c.topology == name)
    rows = outcome.summary[(outcome.summary["topology"] == name) & (outcome.summary["level"] == centre * per)]
    measured_goodput = float(rows[per_gpu(slo.GOODPUT_REQUESTS)].iloc[0]) if len(rows) else math.nan
    predicted = measure(on_profile, topology, workload, centre, plan.slos_ms).goodput_rps / result.gpus
    return Check(
        label(result, len(plan.profiles)),
        centre,
        result.capacity.load,
        (result.slow.load, result.fast.load),
        None if capacity.x is None else capacity.x / per,
        capacity.censored,
        predicted,
        measured_goodput,
    )


def run_validation(plan: Plan, spec: FleetSpec, top: int, folder: Path | None = None) -> list[str]:
    """Validate the top layouts that have a capacity; lines for the terminal."""
    chosen = [r for r in plan.results[:top] if r.capacity.load is not None and not r.capacity.censored]
    if not chosen:
        return ["validate: no top layout has a capacity inside the loads tried; nothing to check"]
    lines = [
        f"validation: the top {len(chosen)} layout(s) on the live simulator, swept at "
        + (
            f"the levels bracketing their predicted capacity and {LEVEL_FACTORS[0]:g} and "
            f"{LEVEL_FACTORS[-1]:g} x it, on the prediction's arrivals"
            if plan.mode is Mode.OPEN
            else f"{', '.join(f'{f:g}' for f in LEVEL_FACTORS)} x their predicted capacity"
        )
        + f" (goal: within {GOAL:.0%})"
    ]
    with tempfile.TemporaryDirectory(prefix="crossover-capacity-") as scratch:
        base = folder or Path(scratch)
        for result in chosen:
            lines.append(line(check_layout(plan, spec, result, base), plan.mode))
    return lines


def line(check: Check, mode: Mode) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{value:+.1%}"

    measured = (
        "-"
        if check.measured_capacity is None
        else format_load(check.measured_capacity, mode)
        + {"above": "+", "below": "-"}.get(check.measured_censored, "")
    )
    low, high = check.band
    band = f"[{format_load(low, mode) if low else '-'}-{format_load(high, mode) if high else '-'}]"
    return (
        f"  {check.layout}: capacity predicted {format_load(check.predicted_capacity, mode)} {band}, "
        f"measured {measured} ({pct(check.capacity_error)}); goodput/GPU at {format_load(check.level, mode)} "
        f"predicted {check.predicted_goodput_per_gpu:.3f}, measured {check.measured_goodput_per_gpu:.3f} "
        f"({pct(check.goodput_error)})"
    )
