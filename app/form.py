"""From the sidebar's raw widget values to a checked sweep: SweepPlan, SLOs and topologies.

The page hands over plain values (strings as typed, numbers, lists); this module turns them into
the loadgen's own SweepPlan or raises UserError with one line naming the field, which the page
shows with st.error. Defaults come from the spec, so the form starts prefilled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from crossover.errors import UserError
from crossover.loadgen.analysis.adaptive import DEFAULT_TARGET_CI, AdaptivePlan, coarse_levels
from crossover.loadgen.plan import Endpoint, LengthDist, Mode, SweepPlan, parse_levels
from crossover.slo import SLO_KINDS
from crossover.spec import FleetSpec

SLO_LABELS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
MAX_LEVELS = 32
MAX_REQUESTS_PER_LEVEL = 100_000
MAX_BOOTSTRAP = 2000
MAX_TURNS = 50
DEFAULT_BOOTSTRAP = 200  # loadgen's default


@dataclass(frozen=True)
class SweepForm:
    """What the user typed or picked; every field is exactly a widget's value."""

    topologies: list[str]
    mode: str = Mode.CLOSED.value
    levels: str = "1,2,4,8,16"
    requests_per_level: int = 32
    input_len: str = "128"
    output_len: str = "64"
    seed: int = 0
    endpoint: str = Endpoint.COMPLETIONS.value
    turns: int = 1  # requests per conversation (chat)
    slos_ms: dict[str, float | None] = field(default_factory=dict)  # None or 0: that SLO is off
    objective: float = 0.99
    bootstrap: int = DEFAULT_BOOTSTRAP  # resamples for the crossover's interval; 0: none
    adaptive: bool = False  # the levels are the range; the sweep adds levels where intervals need them
    target_ci: float = DEFAULT_TARGET_CI


@dataclass(frozen=True)
class SweepRequest:
    """A checked sweep, ready for run_sweep."""

    plan: SweepPlan
    topologies: list[str]
    n_boot: int = DEFAULT_BOOTSTRAP
    adaptive: AdaptivePlan | None = None

    @property
    def first_levels(self) -> tuple[float, ...]:
        """The levels known before the sweep starts (an adaptive sweep adds more as it goes)."""
        return coarse_levels(self.plan) if self.adaptive is not None else self.plan.levels


def default_form(spec: FleetSpec) -> SweepForm:
    """The form prefilled from the spec: all topologies, the spec's SLOs and objective."""
    return SweepForm(
        topologies=[t.name for t in spec.topologies],
        slos_ms={name: spec.slos.thresholds_ms.get(name) for name in SLO_KINDS},
        objective=spec.slos.objective,
    )


def check_slos(slos_ms: dict[str, float | None], objective: float) -> dict[str, float]:
    """The SLOs switched on (positive ms); a UserError when none is, or one is not a number."""
    chosen: dict[str, float] = {}
    for name, value in slos_ms.items():
        if name not in SLO_KINDS:
            raise UserError(f"SLO: unknown SLO {name!r} (use {', '.join(SLO_KINDS)})")
        if value is None or value == 0:
            continue
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"SLO {SLO_LABELS[name]}: must be a positive number of ms, got {value:g}")
        chosen[name] = float(value)
    if not chosen:
        raise UserError("SLO invalid: switch on at least one of TTFT, TPOT, ITL or E2E latency; "
                        "goodput counts the requests that meet them")
    if not 0 < objective < 1:
        raise UserError(f"SLO objective: must be between 0 and 1 (e.g. 0.99), got {objective:g}")
    return chosen


def build_request(form: SweepForm, spec: FleetSpec) -> SweepRequest:
    """Check every field and build the plan; a UserError names the first bad one."""
    known = [t.name for t in spec.topologies]
    if not form.topologies:
        raise UserError("Topologies: pick at least one (two or more to find a crossover)")
    unknown = [name for name in form.topologies if name not in known]
    if unknown:
        raise UserError(f"Topologies: {unknown} are not in the spec (have {known})")
    try:
        mode = Mode(form.mode)
    except ValueError:
        raise UserError(f"Load: unknown mode {form.mode!r} (closed or open)") from None
    what = "Concurrency levels" if mode is Mode.CLOSED else "Request rates (req/s)"
    levels = parse_levels(form.levels, what)
    if len(levels) > MAX_LEVELS:
        raise UserError(f"{what}: at most {MAX_LEVELS} levels, got {len(levels)}")
    if not 1 <= form.requests_per_level <= MAX_REQUESTS_PER_LEVEL:
        raise UserError(f"Requests per level: between 1 and {MAX_REQUESTS_PER_LEVEL}, "
                        f"got {form.requests_per_level}")
    input_len = LengthDist.parse(form.input_len, "Input length")
    output_len = LengthDist.parse(form.output_len, "Output length")
    longest = input_len.high + output_len.high
    if longest > spec.model.max_model_len:
        raise UserError(f"Input + output length: up to {longest} tokens exceeds the model's "
                        f"max_model_len {spec.model.max_model_len}")
    slos = check_slos(form.slos_ms, form.objective)
    try:
        endpoint = Endpoint(form.endpoint)
    except ValueError:
        raise UserError(f"Endpoint: unknown endpoint {form.endpoint!r} (completions or chat)") from None
    if not 1 <= form.turns <= MAX_TURNS:
        raise UserError(f"Turns per conversation: between 1 and {MAX_TURNS}, got {form.turns}")
    if form.turns > 1 and endpoint is not Endpoint.CHAT:
        raise UserError("Turns per conversation: a conversation needs the chat endpoint")
    if not 0 <= form.bootstrap <= MAX_BOOTSTRAP:
        raise UserError(f"Bootstrap resamples: between 0 and {MAX_BOOTSTRAP}, got {form.bootstrap}")
    try:
        plan = SweepPlan(mode=mode, levels=levels, requests_per_level=int(form.requests_per_level),
                         input_len=input_len, output_len=output_len, seed=int(form.seed), endpoint=endpoint,
                         turns=int(form.turns),
                         slos_ms=slos, objective=float(form.objective))
    except UserError as exc:
        raise UserError(str(exc).replace("plan.levels", what)) from None
    adaptive = None
    if form.adaptive:
        try:
            adaptive = AdaptivePlan(target_ci=float(form.target_ci))
            coarse_levels(plan)
        except UserError as exc:
            raise UserError(str(exc).replace("--target-ci", "Target interval width")
                            .replace("--adaptive", "Adaptive levels")) from None
        if form.bootstrap < 1:
            raise UserError("Bootstrap resamples: adaptive levels need intervals, give at least 1")
    # keep the spec's order, whatever order the user picked them in
    return SweepRequest(plan=plan, topologies=[name for name in known if name in form.topologies],
                        n_boot=int(form.bootstrap), adaptive=adaptive)
