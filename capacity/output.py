"""What the search hands the user: the terminal table, results.json, a plot, and the top layouts
as fleet specs the rest of the package runs on (`crossover rules`, `dashboards`, `sweep`)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from crossover.capacity.evaluate import Point, Workload, sampling_error
from crossover.capacity.layouts import Fit, Layout
from crossover.capacity.profiles import Profile
from crossover.capacity.search import Front, LayoutResult, MapEntry, Verdict, key, label, per_usd
from crossover.loadgen.analysis.crossings import format_load
from crossover.loadgen.plan import Mode
from crossover.spec import FleetSpec, load_spec

RESULTS = "capacity.json"  # in --out DIR, with plot.html and spec-*.yaml
KIND = "crossover-capacity"  # RESULTS' "kind": how the app tells a plan from a run


@dataclass(frozen=True)
class Plan:
    """Everything one search found: what a table, a JSON file and a validation read."""

    spec_source: str
    gpus: int
    workload: Workload
    objective: float
    slos_ms: dict[str, float]
    user_loads: tuple[float, ...]
    profiles: tuple[Profile, ...]
    fits: tuple[Fit, ...]
    results: tuple[LayoutResult, ...]  # ranked, best first
    verdict: Verdict
    map_loads: tuple[float, ...]
    crossover_map: tuple[MapEntry, ...]
    front: Front
    prices: dict[str, float]  # GPU label -> USD per GPU-hour

    @property
    def mode(self) -> Mode:
        return self.workload.mode

    def price_per_hour(self, result: LayoutResult) -> float | None:
        profile = next(p for p in self.profiles if p.name == result.profile)
        price = self.prices.get(str(profile.hardware.get("gpu")))
        return None if price is None else price * result.gpus


def _ms(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.0f}"


def _load(value: float | None, mode: Mode) -> str:
    return "-" if value is None else format_load(value, mode)


def load_unit(workload: Workload) -> str:
    """The load axis' unit: a concurrency, requests/s, or conversations/s for a multi-turn workload
    (open loop: conversations arrive at the rate; each turn is a request)."""
    if workload.mode is Mode.CLOSED:
        return "conc"
    return "conv/s" if workload.multi_turn else "req/s"


def hit_share(plan: Plan) -> tuple[str, float] | None:
    """The leader's predicted prefix-cache hit share (prompt tokens found cached) at its capacity."""
    for r in plan.results:
        if r.capacity.at is not None:
            return label(r, len(plan.profiles)), r.capacity.at.prefix_hit_share
    return None


def _turn_lines(plan: Plan) -> list[str]:
    workload, lines = plan.workload, []
    if plan.mode is Mode.OPEN and workload.multi_turn:
        lines.append(
            f"rate: conversations/s (one conversation is {workload.mean_turns:.2f} requests on average, "
            "so 1 conv/s is that many req/s); goodput counts every turn as a request"
        )
    share = hit_share(plan)
    if share is not None:
        layout, hits = share
        lines.append(f"prefix cache: {hits:.0%} of prompt tokens predicted cached ({layout}, at capacity)")
    return lines


def table(plan: Plan) -> list[str]:
    """The ranked layouts, the verdict, the map, the front and what is assumed: terminal lines."""
    mode, n = plan.mode, len(plan.profiles)
    unit = load_unit(plan.workload)
    lines = []
    fits = ", ".join(
        f"TP{f.tp} {f.needed_gib:.1f}/{f.usable_gib:.1f} GiB{'' if f.fits else ' (no)'}" for f in plan.fits
    )
    lines.append(f"memory fit per GPU (weights + KV of one max_model_len request / usable): {fits}")
    head = f"{'#':>2} {'layout':<28} {'GPUs':>4} {'capacity (' + unit + ')':>22} {'goodput/GPU':>19}"
    user = plan.user_loads[0] if len(plan.user_loads) == 1 else None
    if user is not None:
        head += (
            f" | at {format_load(user, mode)} {unit}: {'attain':>6} {'good/GPU':>8} {'TTFT99':>6} "
            f"{'TPOT99':>6} {'ITL99':>6} {'KV':>4} {'preempt':>7}"
        )
    if plan.prices:
        head += f" {'good/$':>8}"
    lines.append(head)
    for rank, r in enumerate(plan.results, 1):
        cap = r.capacity
        if cap.load is None:
            capacity = f"misses at {_load(cap.high, mode)}"
        else:
            above = "+" if cap.censored == "above" else ""
            capacity = (
                f"{_load(cap.load, mode)}{above} [{_load(r.slow.load, mode)}-{_load(r.fast.load, mode)}]"
            )
        low, high = r.band
        line = (
            f"{rank:>2} {label(r, n):<28} {r.gpus:>4} {capacity:>22} "
            f"{r.goodput_per_gpu():>6.3f} [{low:.3f}-{high:.3f}]"
        )
        if user is not None and r.at_user:
            p = r.at_user[0]
            line += (
                f" | {'':>{len(format_load(user, mode)) + len(unit) + 5}}{p.attainment:>6.1%} "
                f"{p.goodput_rps / r.gpus:>8.3f} {_ms(p.ttft_p99_ms):>6} {_ms(p.tpot_p99_ms):>6} "
                f"{_ms(p.itl_p99_ms):>6} {p.kv_usage_peak:>4.0%} {p.preemptions:>7}"
            )
        if plan.prices:
            price = plan.price_per_hour(r)
            line += f" {per_usd(r, plan.price_per_hour):>8.0f}" if price else f" {'-':>8}"
        lines.append(line)
    lines.append(plan.verdict.sentence)
    counted = plan.workload.requests
    lines.append(f"workload: {plan.workload.describe()}")
    if plan.workload.conversations:
        lines += _turn_lines(plan)
    lines.append(
        f"capacity: the highest {mode.axis} whose SLO attainment ({_slos(plan.slos_ms)}) meets "
        f"{plan.objective:.0%}, bracketed and bisected; goodput/GPU: good requests/s per GPU there; "
        f"[..]: the band from each profile's step-time error; {counted} requests per level, "
        f"attainment sampling error +-{sampling_error(plan.objective, counted):.3f} at the objective"
    )
    if user is not None:
        best_capacity = max((r.capacity.load or 0.0) for r in plan.results)
        if best_capacity and user > best_capacity:
            best = max(plan.results, key=lambda r: r.capacity.load or 0.0)
            lines.append(
                f"{mode.axis} {format_load(user, mode)} is beyond every layout's capacity: the best, "
                f"{label(best, n)}, holds {format_load(best_capacity, mode)}"
            )
    if plan.crossover_map:
        lines.append(
            "crossover map (most goodput per GPU at each "
            + mode.axis
            + "; '=' a tie within bands): "
            + "; ".join(
                f"{format_load(e.load, mode)}: {' = '.join(e.leaders) or 'none'}" for e in plan.crossover_map
            )
        )
    if plan.front.points:
        lines.append(
            "Pareto front (output tokens/s per GPU, tokens/s per user): "
            + "; ".join(
                f"{name} at {format_load(load, mode)}: {x:.0f}, {y:.1f}"
                for name, load, x, y in plan.front.points
            )
        )
    for profile in plan.profiles:
        lines.append(
            f"profile {profile.name}: step-time error {profile.step_error:.1%} mean, "
            f"{profile.worst_step_error:.0%} worst ({profile.source}); assumed, not measured: "
            + "; ".join(profile.assumed or ("nothing named",))
        )
    return lines


def _slos(slos_ms: dict[str, float]) -> str:
    return ", ".join(f"{kind.upper()} <= {ms:g} ms" for kind, ms in slos_ms.items())


def _point_json(point: Point | None) -> dict[str, Any] | None:
    if point is None:
        return None
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in asdict(point).items()
    }


def _verdict_json(found: Verdict | None) -> dict[str, Any] | None:
    if found is None:
        return None
    lead = found.lead if math.isfinite(found.lead) else None
    return {"leaders": list(found.leaders), "lead": lead, "sentence": found.sentence}


def to_json(plan: Plan) -> dict[str, Any]:
    n = len(plan.profiles)

    def capacity(found: Any) -> dict[str, Any]:
        return {
            "load": found.load,
            "bracket": [found.low, found.high],
            "censored": found.censored,
            "at": _point_json(found.at),
            "levels": {str(k): v for k, v in found.levels.items()},
        }

    return {
        "kind": KIND,
        "spec": plan.spec_source,
        "gpus": plan.gpus,
        "axis": plan.mode.axis,
        "workload": {
            **plan.workload.summary(),
            "mode": plan.mode.value,
            "load_unit": load_unit(plan.workload),
            "requests_per_conversation": plan.workload.mean_turns,
            "prefix_hit_share": None if (share := hit_share(plan)) is None else share[1],
        },
        "objective": plan.objective,
        "slos_ms": plan.slos_ms,
        "user_loads": list(plan.user_loads),
        "sampling_error": sampling_error(plan.objective, plan.workload.requests),
        "profiles": [
            {
                "name": p.name,
                "source": p.source,
                "step_error": p.step_error,
                "worst_step_error": p.worst_step_error,
                "measured": p.measured,
                "assumed": list(p.assumed),
            }
            for p in plan.profiles
        ],
        "memory_fit": [{**asdict(f), "needed_gib": f.needed_gib, "fits": f.fits} for f in plan.fits],
        "layouts": [
            {
                "key": key(r, n),
                "label": label(r, n),
                "profile": r.profile,
                "gpus": r.gpus,
                "layout": asdict(r.layout),
                "capacity": capacity(r.capacity),
                "slow": capacity(r.slow),
                "fast": capacity(r.fast),
                "goodput_per_gpu": r.goodput_per_gpu(),
                "goodput_per_gpu_band": list(r.band),
                "price_per_hour": plan.price_per_hour(r),
                "at_user": [_point_json(p) for p in r.at_user],
                "along": [_point_json(p) for p in r.along],
            }
            for r in plan.results
        ],
        "verdict": {
            "leaders": list(plan.verdict.leaders),
            "lead": plan.verdict.lead if math.isfinite(plan.verdict.lead) else None,
            "sentence": plan.verdict.sentence,
            "per_dollar": _verdict_json(plan.verdict.per_dollar),
        },
        "crossover_map": [{"load": e.load, "leaders": list(e.leaders)} for e in plan.crossover_map],
        "pareto_front": [
            {"layout": name, "load": load, "output_tps_per_gpu": x, "interactivity": y}
            for name, load, x, y in plan.front.points
        ],
    }


def fleet_spec(spec: FleetSpec, profile: Profile, layouts: Sequence[Layout]) -> dict[str, Any]:
    """The spec with the layouts as its topologies (instances' URLs: loopback placeholders)."""
    data = profile.apply(spec).model_dump(mode="json", exclude_none=True)
    topologies = []
    for index, layout in enumerate(layouts):
        topology = layout.topology(port=8100 + 40 * index)
        topologies.append(topology.model_dump(mode="json", exclude_none=True))
    data["topologies"] = topologies
    return data


def write(plan: Plan, spec: FleetSpec, out: Path, top: int) -> list[Path]:
    """capacity.json, plot.html and spec-*.yaml (each top layout alone, and spec-top.yaml with them
    all, so one sweep compares them). Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / RESULTS]
    (out / RESULTS).write_text(json.dumps(to_json(plan), indent=1) + "\n")
    n = len(plan.profiles)
    chosen = [r for r in plan.results[:top] if r.capacity.at is not None] or list(plan.results[:1])
    header = (
        "# Written by `crossover capacity`: the instances' URLs are placeholders; fill in where each\n"
        "# instance serves (and the P/D proxy's entrypoint), then run crossover rules / dashboards / sweep.\n"
    )
    for result in chosen:
        profile = next(p for p in plan.profiles if p.name == result.profile)
        path = out / f"spec-{key(result, n).replace('@', '-')}.yaml"
        path.write_text(header + yaml.safe_dump(fleet_spec(spec, profile, [result.layout]), sort_keys=False))
        load_spec(path)  # what we hand over must load
        written.append(path)
    same_profile = [r for r in chosen if r.profile == chosen[0].profile]
    profile = next(p for p in plan.profiles if p.name == chosen[0].profile)
    path = out / "spec-top.yaml"
    path.write_text(
        header + yaml.safe_dump(fleet_spec(spec, profile, [r.layout for r in same_profile]), sort_keys=False)
    )
    load_spec(path)
    written.append(path)
    written.append(plot(plan, out / "plot.html"))
    return written


def plot(plan: Plan, path: Path) -> Path:
    """Goodput per GPU against load per layout (the crossover map's curves) and the Pareto view."""
    import altair as alt
    import pandas as pd

    n = len(plan.profiles)
    rows = [
        {
            "layout": label(r, n),
            "load": load,
            "goodput_per_gpu": p.goodput_rps / r.gpus,
            "output_tps_per_gpu": p.output_tps / r.gpus,
            "interactivity": p.interactivity,
        }
        for r in plan.results
        for load, p in zip(plan.map_loads, r.along, strict=False)
        if p is not None
    ]
    frame = pd.DataFrame(rows)
    scale = alt.Scale(type="log", base=2) if plan.mode is Mode.CLOSED else alt.Scale()
    curves = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("load:Q", title=plan.mode.axis, scale=scale),
            y=alt.Y("goodput_per_gpu:Q", title="good requests/s per GPU"),
            color="layout:N",
        )
        .properties(title="goodput per GPU by load", width=420, height=300)
    )
    front = (
        alt.Chart(frame)
        .mark_point()
        .encode(
            x=alt.X("output_tps_per_gpu:Q", title="output tokens/s per GPU"),
            y=alt.Y("interactivity:Q", title="tokens/s per user"),
            color="layout:N",
        )
        .properties(title="throughput against interactivity", width=420, height=300)
    )
    (curves | front).save(str(path))
    return path
