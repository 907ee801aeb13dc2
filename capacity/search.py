"""The search: every layout of the budget on every profile, in worker processes, then the ranking.

Each layout is one task (its capacity, the band's two ends, its figures at the user's load and
along the crossover map's levels); tasks go to a process pool (the discrete-event runs are pure
Python, so threads would share one core). Ranking is by goodput per GPU at capacity; a layout is
the winner only when its band's low end is above every other band's high end, else the layouts
whose bands reach the leader's are said as a tie.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TypeVar

from crossover import slo
from crossover.capacity.evaluate import Capacity, Point, Workload, find_capacity, first_guess, measure, scaled
from crossover.capacity.layouts import Layout
from crossover.capacity.profiles import Profile
from crossover.loadgen.plan import Mode
from crossover.spec import FleetSpec

T = TypeVar("T")
TOLERANCE = 0.03  # a capacity's bracket is bisected until narrower than this share of its low end


@dataclass(frozen=True)
class Task:
    spec: FleetSpec  # on the profile's hardware
    profile: str
    step_error: float
    layout: Layout
    workload: Workload
    objective: float
    slos_ms: dict[str, float]
    user_loads: tuple[float, ...]  # the user's load, or the range's levels
    points_only: bool = False  # the second pass: only the figures at user_loads (the map's levels)
    ceiling: float | None = None  # the second pass measures no load above this (past the capacity)


@dataclass(frozen=True)
class LayoutResult:
    profile: str
    layout: Layout
    capacity: Capacity
    slow: Capacity  # every step (1 + error) times as long: the band's low end
    fast: Capacity  # (1 - error) times as long: its high end
    at_user: tuple[Point, ...]  # at each of the user's loads
    along: tuple[Point | None, ...] = ()  # at each of the crossover map's loads (None: past capacity)

    @property
    def gpus(self) -> int:
        return self.layout.gpus

    def goodput_per_gpu(self, capacity: Capacity | None = None) -> float:
        """Good requests/s per GPU at capacity (0 when it misses the objective at the lowest load)."""
        found = capacity or self.capacity
        return found.at.goodput_rps / self.gpus if found.at is not None else 0.0

    @property
    def band(self) -> tuple[float, float]:
        """Goodput per GPU at capacity, from the slow end to the fast end of the step-time error."""
        values = sorted(
            (self.goodput_per_gpu(self.slow), self.goodput_per_gpu(self.fast), self.goodput_per_gpu())
        )
        return values[0], values[-1]


def run_points(task: Task) -> tuple[Point | None, ...]:
    """The figures at each of user_loads; None above the ceiling (a layout past its capacity is out
    of the running there: measuring how far it misses would cost the most of any level)."""
    topology = task.layout.topology()
    return tuple(
        None
        if task.ceiling is not None and load > task.ceiling
        else measure(task.spec, topology, task.workload, load, task.slos_ms)
        for load in task.user_loads
    )


def map_ceiling(result: LayoutResult) -> float | None:
    """The highest map load worth measuring for a layout: a quarter past its band's high end."""
    if result.capacity.censored == "above":
        return None
    top = max((c.load or c.high or 0.0) for c in (result.capacity, result.fast, result.slow))
    return 1.25 * top


def run_task(task: Task) -> LayoutResult:
    topology = task.layout.topology()
    workload, objective = task.workload, task.objective
    guess = first_guess(task.spec, topology, workload)

    def search(spec: FleetSpec, start: float, step: float) -> Capacity:
        return find_capacity(
            lambda load: measure(spec, topology, workload, load, task.slos_ms),
            objective,
            workload.mode,
            start,
            tolerance=TOLERANCE,
            step=step,
        )

    nominal = search(task.spec, guess, 2.0)
    # The band's ends lie about the error's width from the nominal capacity: they start there and
    # step by that width, a short bracket each.
    start = nominal.load or guess
    width = 1 + max(task.step_error, TOLERANCE)
    slow = search(scaled(task.spec, 1 + task.step_error), start / (1 + task.step_error), width)
    if nominal.censored == "below":  # misses at the lowest load already: faster steps may not
        fast = search(scaled(task.spec, 1 - task.step_error), guess, 2.0)
    else:
        fast = search(scaled(task.spec, 1 - task.step_error), start * (1 + task.step_error), width)
    at_user = tuple(measure(task.spec, topology, workload, load, task.slos_ms) for load in task.user_loads)
    return LayoutResult(task.profile, task.layout, nominal, slow, fast, at_user)


def run_all(
    tasks: Sequence[Task],
    work: Callable[[Task], T],
    pool: ProcessPoolExecutor | None,
    progress: Callable[[], None] = lambda: None,
) -> list[T]:
    """`work` on every task, in the pool's processes (None: in this process), in the tasks' order."""
    if pool is None or len(tasks) == 1:
        out = []
        for task in tasks:
            out.append(work(task))
            progress()
        return out
    futures: list[Future[T]] = [pool.submit(work, task) for task in tasks]
    for future in futures:
        future.add_done_callback(lambda f: progress())
    return [future.result() for future in futures]


def workers(asked: int | None) -> int:
    """Worker processes: as asked, else one per core this process may use."""
    if asked is not None:
        return asked
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def map_levels(results: Sequence[LayoutResult], mode: Mode, given: Sequence[float] = ()) -> tuple[float, ...]:
    """The crossover map's levels: the user's range, else doublings (closed) or eight steps
    (open) up to the largest capacity found."""
    if given and len(given) > 1:
        return tuple(given)
    top = max((r.capacity.load or 0.0 for r in results), default=0.0) or 1.0
    if mode is Mode.CLOSED:
        levels, c = [], 1
        while c <= top * 1.5:
            levels.append(float(c))
            c *= 2
        return tuple(levels)
    return tuple(float(f"{top * k / 8:.3g}") for k in range(1, 10))


@dataclass(frozen=True)
class Verdict:
    """The ranking's conclusion: a winner, or the leaders that tie within their bands."""

    leaders: tuple[str, ...]  # layout keys; one: a winner
    lead: float  # the leader's goodput per GPU over the runner-up's, minus 1 (0 without a runner-up)
    sentence: str
    per_dollar: Verdict | None = None  # with --price: the same judgement on good requests per USD


def key(result: LayoutResult, profiles: int) -> str:
    return f"{result.layout.name}@{result.profile}" if profiles > 1 else result.layout.name


def label(result: LayoutResult, profiles: int) -> str:
    return f"{result.layout.label} on {result.profile}" if profiles > 1 else result.layout.label


def ranked(
    results: Sequence[LayoutResult], price: Callable[[LayoutResult], float | None] | None = None
) -> list[LayoutResult]:
    """Best first: goodput per GPU at capacity (per dollar when every layout has a price)."""
    if price is not None and all(price(r) for r in results):
        return sorted(results, key=lambda r: -per_usd(r, price))
    return sorted(results, key=lambda r: -r.goodput_per_gpu())


def _judge(
    order: Sequence[LayoutResult],
    profiles: int,
    value: Callable[[LayoutResult], float],
    band: Callable[[LayoutResult], tuple[float, float]],
    unit: str,
) -> Verdict:
    """A winner when the leader's band's low end is above every other layout's high end; otherwise
    the layouts whose bands reach the leader's, said as a tie. `order` is best first by `value`."""
    if not order:
        return Verdict((), 0.0, "no layout")
    best = order[0]
    if best.capacity.at is None:
        return Verdict((), 0.0, "no layout meets the SLO objective at any load tried")
    low = band(best)[0]
    tied = [r for r in order[1:] if band(r)[1] >= low and r.capacity.at is not None]
    runner = value(order[1]) if len(order) > 1 else 0.0
    lead = value(best) / runner - 1 if runner > 0 else math.inf
    if not tied:
        if len(order) == 1:
            return Verdict((key(best, profiles),), 0.0, f"{label(best, profiles)} is the only layout")
        return Verdict(
            (key(best, profiles),),
            lead,
            f"winner: {label(best, profiles)}, {lead:+.0%} {unit} over "
            f"{label(order[1], profiles)}, more than the step-time bands",
        )
    names = [label(r, profiles) for r in (best, *tied)]
    return Verdict(
        tuple(key(r, profiles) for r in (best, *tied)),
        lead,
        f"tie: {', '.join(names)} are within each other's bands "
        f"(the leader's lead {lead:+.1%} {unit} is inside the step-time error)",
    )


def per_usd(result: LayoutResult, price: Callable[[LayoutResult], float | None]) -> float:
    """Good requests per US dollar at capacity, from the layout's price per hour."""
    return result.goodput_per_gpu() * result.gpus * 3600 / (price(result) or math.inf)


def verdict(
    order: Sequence[LayoutResult],
    profiles: int,
    price: Callable[[LayoutResult], float | None] | None = None,
) -> Verdict:
    """Per GPU; with a price for every layout, per dollar as well (its own winner or tie, the bands
    scaled by the same price), in one sentence."""
    per_gpu = _judge(
        ranked(order), profiles, LayoutResult.goodput_per_gpu, lambda r: r.band, "goodput per GPU"
    )
    if price is None or not order or not all(price(r) for r in order):
        return per_gpu
    scale = {id(r): r.gpus * 3600 / (price(r) or math.inf) for r in order}
    dollar = _judge(
        ranked(order, price),
        profiles,
        lambda r: per_usd(r, price),
        lambda r: (r.band[0] * scale[id(r)], r.band[1] * scale[id(r)]),
        "good requests per USD",
    )
    return replace(per_gpu, sentence=f"{per_gpu.sentence}; per dollar: {dollar.sentence}", per_dollar=dollar)


@dataclass(frozen=True)
class MapEntry:
    load: float
    leaders: tuple[str, ...]  # one: that layout wins at this load; more: a tie within the bands


def crossover_map(
    results: Sequence[LayoutResult],
    loads: Sequence[float],
    profiles: int,
    error: Callable[[LayoutResult], float],
) -> list[MapEntry]:
    """Which layout has the most goodput per GPU at each load, tied where the leader's lead is
    within the bands (goodput taken as uncertain by the profile's step-time error, first order)."""
    out = []
    for i, load in enumerate(loads):
        values = sorted(
            (
                (p.goodput_rps / r.gpus, r)
                for r in results
                if len(r.along) > i and (p := r.along[i]) is not None
            ),
            key=lambda v: -v[0],
        )
        if not values or values[0][0] <= 0:
            out.append(MapEntry(load, ()))
            continue
        best_value, best = values[0]
        floor = best_value * (1 - error(best))
        leaders = [key(best, profiles)] + [
            key(r, profiles) for v, r in values[1:] if v * (1 + error(r)) >= floor
        ]
        out.append(MapEntry(load, tuple(leaders)))
    return out


@dataclass
class Front:
    """The Pareto front: (output tokens/s per GPU, tokens/s per user) points no other beats on both."""

    points: list[tuple[str, float, float, float]] = field(default_factory=list)  # (layout, load, x, y)


def pareto(results: Sequence[LayoutResult], loads: Sequence[float], profiles: int) -> Front:
    candidates = [
        (key(r, profiles), loads[i], p.output_tps / r.gpus, p.interactivity)
        for r in results
        for i, p in enumerate(r.along)
        if p is not None and math.isfinite(p.interactivity)
    ]
    front = slo.pareto_front([(x, y) for _, _, x, y in candidates])
    return Front([candidates[i] for i in front])


def profile_error(profiles: Sequence[Profile]) -> Callable[[LayoutResult], float]:
    errors = {p.name: p.step_error for p in profiles}
    return lambda r: errors[r.profile]
