"""One layout on the discrete-event ground truth (crossover.sim.truth): its figures at a load, and
its capacity, the highest load whose SLO attainment meets the objective.

The capacity is found by bracketing: from a first guess the load doubles (or halves) until one
measured level meets the objective and another misses it, then the bracket is bisected on the load
axis's scale (Mode.scale: log2 concurrency, linear rate) until it is narrower than `tolerance`;
the estimate interpolates the attainment between the bracket's ends, and the ends reported are
loadgen's one bracket search (crossings.bracket) over the levels measured, as the sweep reports
its own.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from crossover import slo
from crossover.loadgen.analysis.crossings import bracket
from crossover.loadgen.plan import Mode, SweepPlan
from crossover.loadgen.traffic.dataset import arrival_offsets
from crossover.sim import truth
from crossover.sim.model import StepLoad
from crossover.spec import FleetSpec, Topology

DEFAULT_REQUESTS = 400  # per measured level: the attainment's sampling error at 0.99 is +-0.005
WARMUP_SHARE = 0.1  # open loop: the first arrivals meet an empty fleet; they are not counted
DEFAULT_SPAN_S = 30.0
MAX_REQUESTS = 3_000  # per level: bounds the cost of a level far past capacity


@dataclass(frozen=True)
class Workload:
    """What the users send: fixed prompt and output lengths, or a workload file's conversations drawn
    with the seed, on one load axis. Open loop, the rate is of conversations (a single request is a
    conversation of one turn); every turn is a request to the SLOs and the goodput."""

    mode: Mode
    input_len: int = 512  # with a file: its mean over every turn, for first_guess's step model
    output_len: int = 256
    requests: int = DEFAULT_REQUESTS  # counted per measured level, at least
    seed: int = 0
    # Open loop: arrivals span at least this long, so that a queue that grows is seen growing (a
    # burst of `requests` alone meets the SLOs at any rate the fleet can hold that many of at once).
    min_span_s: float = DEFAULT_SPAN_S
    # a workload file's conversations (truth.Turn: prompt tokens, output tokens, prefix-cache block
    # hashes); () fixed lengths
    conversations: tuple[truth.Conversation, ...] = ()
    source: str = ""  # the workload file, for the output and --validate's sweep
    # its format (loadgen.plan.DatasetKind), endpoint and tokenizer, as the sweep takes them
    dataset: str = ""
    endpoint: str = "completions"
    tokenizer: str | None = None
    turns: int = 1  # the most turns a conversation has: the sweep's --turns for them
    think_time_s: float = 0.0  # between a turn's answer and the next turn (the sweep's --think-time)

    def draw(self, rng: random.Random) -> truth.Conversation:
        """One conversation: a request of the fixed lengths, or a file entry drawn with `rng`."""
        if not self.conversations:
            return (truth.Turn(self.input_len, self.output_len),)
        return rng.choice(self.conversations)

    @property
    def mean_turns(self) -> float:
        """Requests per conversation, on average over the file's conversations (1 without a file)."""
        if not self.conversations:
            return 1.0
        return sum(len(c) for c in self.conversations) / len(self.conversations)

    @property
    def multi_turn(self) -> bool:
        return self.mean_turns > 1

    def describe(self) -> str:
        """The lengths in words: fixed, or the file's distribution (mean and p50/p99)."""
        if not self.conversations:
            return f"{self.input_len} prompt and {self.output_len} output tokens per request"
        turns = [turn for talk in self.conversations for turn in talk]
        prompts = np.array([t.prompt_tokens for t in turns])
        outputs = np.array([t.output_tokens for t in turns])
        text = (
            f"{self.source}: {len(self.conversations)} entries, drawn with the seed; prompt tokens "
            f"{_dist(prompts)}; output tokens {_dist(outputs)}"
        )
        if self.multi_turn:
            text += (
                f"; {len(self.conversations)} conversations of {len(turns)} turns, turns per conversation "
                f"{_dist(np.array([len(c) for c in self.conversations]), '.1f')}, think time "
                f"{self.think_time_s:g} s; a turn's prompt is the history and its new message"
            )
        return text

    def summary(self) -> dict[str, object]:
        """The workload for capacity.json: the file's conversations left out (the file holds them)."""
        out = {k: v for k, v in asdict(self).items() if k != "conversations"}
        out |= {"entries": len(self.conversations), "lengths": self.describe()}
        if self.conversations:
            turns = np.array([len(c) for c in self.conversations])
            p50, p99 = np.percentile(turns, [50, 99])
            out |= {
                "conversations": len(self.conversations),
                "turns_per_conversation": {"mean": float(turns.mean()), "p50": float(p50), "p99": float(p99)},
            }
        return out

    def open_conversations(self, rate: float) -> int:
        """Conversations counted at an open-loop rate (conversations/s): enough for `requests`
        requests, or more to span min_span_s."""
        turns = self.mean_turns
        spanned = min(math.ceil(MAX_REQUESTS / turns), math.ceil(rate * self.min_span_s))
        return max(math.ceil(self.requests / turns), spanned)

    def session_life(self, slos_ms: Mapping[str, float], step_s: float) -> float:
        """How long a conversation lasts when its turns meet the SLOs (p90 over the file's): each turn
        its E2E SLO, or its TTFT SLO and its output at the TPOT (ITL) SLO, else at `step_s` a token;
        and the think times. 0 for single requests: they need no ramp."""
        if not self.multi_turn:
            return 0.0
        per_token = (slos_ms.get("tpot") or slos_ms.get("itl") or step_s * 1000.0) / 1000.0
        ttft = slos_ms.get("ttft", 0.0) / 1000.0

        def turn(output: int) -> float:
            e2el = slos_ms.get("e2el")
            return e2el / 1000.0 if e2el else ttft + per_token * max(0, output - 1)

        lives = [sum(turn(t.output_tokens) for t in talk) + self.think_time_s * (len(talk) - 1)
                 for talk in self.conversations]
        return float(np.percentile(lives, 90))

    def open_sweep(self, levels: tuple[float, ...], **fields: Any) -> SweepPlan:
        """The open-loop sweep that the ground truth's levels stand for and `--validate` runs: at each
        rate, rate x min_span_s requests counted (at least `requests`) after a WARMUP_SHARE more, on
        Poisson arrivals drawn with the seed by the sweep's own draw (loadgen's arrival_offsets), one
        sequence scaled to every rate (shared_arrivals: the attainment falls with load, not with the
        draw, so the search and the bands see the load). One plan for both, so a level the planner
        measured is swept live with the same arrivals, the same count and the same last arrival
        (the one that waits longest)."""
        return SweepPlan(mode=Mode.OPEN, levels=levels, seed=self.seed, shared_arrivals=True,
                         duration_s=self.min_span_s * (1 + WARMUP_SHARE),
                         min_requests=self.requests + round(self.requests * WARMUP_SHARE), **fields)

    def open_sent(self, rate: float) -> int:
        """Requests sent at an open-loop rate, the warm-up's included (open_sweep's count, the counted
        ones at most MAX_REQUESTS)."""
        sent = self.open_sweep((rate,)).requests_for(rate)
        assert sent is not None
        return min(sent, MAX_REQUESTS + round(MAX_REQUESTS * WARMUP_SHARE))

    def open_requests(self, rate: float) -> int:
        """Requests counted at an open-loop rate: `requests`, or more to span min_span_s."""
        sent = self.open_sent(rate)
        return sent - round(sent * WARMUP_SHARE / (1 + WARMUP_SHARE))


def _dist(values: np.ndarray, digits: str = ".0f") -> str:
    p50, p99 = np.percentile(values, [50, 99])
    return f"mean {values.mean():{digits}}, p50 {p50:.0f}, p99 {p99:.0f}"


@dataclass(frozen=True)
class Point:
    """A layout's ground-truth figures at one load (latencies in ms, rates per second)."""

    load: float
    counted: int
    attainment: float
    goodput_rps: float  # good requests per second, whole layout
    output_tps: float  # output tokens per second, whole layout
    ttft_p99_ms: float
    tpot_p99_ms: float
    itl_p99_ms: float
    tpot_median_ms: float
    kv_usage_peak: float
    preemptions: int
    prefix_hit_share: float = 0.0  # prompt tokens found in the prefix cache, of all prompt tokens

    def per_gpu(self, gpus: int) -> tuple[float, float]:
        """(goodput, output tokens/s) per GPU."""
        return self.goodput_rps / gpus, self.output_tps / gpus

    @property
    def interactivity(self) -> float:
        """One user's decode rate (slo.interactivity of the median TPOT)."""
        return slo.interactivity(self.tpot_median_ms / 1000.0)


def sampling_error(objective: float, counted: int) -> float:
    """The standard error of an attainment of `objective` estimated from `counted` requests."""
    return math.sqrt(objective * (1 - objective) / max(1, counted))


def _quantile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q * 100)) * 1000.0 if values else math.nan


def _point(
    load: float,
    traces: tuple[truth.RequestTrace, ...],
    duration: float,
    slos_ms: Mapping[str, float],
    kv_peak: float,
    preemptions: int,
) -> Point:
    thresholds = {kind: ms / 1000.0 for kind, ms in slos_ms.items()}
    good = tokens = 0
    itls: list[float] = []
    for trace in traces:
        request_itls = trace.itls
        itls += request_itls
        # The sweep's per-request values (summary.SOURCE_COLUMN): ITL is a request's largest gap.
        values = {
            "ttft": trace.ttft,
            "tpot": trace.tpot,
            "itl": max(request_itls, default=0.0),
            "e2el": (trace.finish or 0.0) - trace.arrival,
        }
        good += slo.is_good(True, values, thresholds)
        tokens += len(trace.token_times)
    tpots = [t.tpot for t in traces if len(t.token_times) > 1]
    return Point(
        load,
        len(traces),
        good / len(traces),
        slo.goodput(len(traces) / duration, good / len(traces)),
        tokens / duration,
        _quantile_ms([t.ttft for t in traces], slo.TAIL_QUANTILE),
        _quantile_ms(tpots, slo.TAIL_QUANTILE),
        _quantile_ms(itls, slo.TAIL_QUANTILE),
        _quantile_ms(tpots, slo.INTERACTIVITY_QUANTILE),
        kv_peak,
        preemptions,
        sum(t.cached_tokens for t in traces) / max(1, sum(t.prompt_tokens for t in traces)),
    )


def measure(
    spec: FleetSpec, topology: Topology, workload: Workload, load: float, slos_ms: Mapping[str, float]
) -> Point:
    """The layout at one load: a closed-loop concurrency or a Poisson rate (conversations/s; each a
    request without multi-turn conversations)."""
    if workload.mode is Mode.CLOSED:
        run = truth.closed_loop_run(
            spec,
            topology,
            int(load),
            workload.input_len,
            workload.output_len,
            # at least two rounds of every client, after two (of whole conversations: until then
            # the clients are on their first turns, not on every stage of a conversation)
            measured=max(workload.requests, 2 * int(load)),
            draw=_drawer(workload),
            think_time_s=workload.think_time_s,
            warmup=math.ceil(2 * int(load) * workload.mean_turns),
        )
        return _closed_point(run, load, slos_ms)
    if workload.multi_turn:
        # conversations: a conversation's life of warm-up first (open_counts)
        warmup, counted_conversations = open_counts(spec, topology, workload, load, slos_ms)
        total = warmup + counted_conversations
    else:
        # single requests: the sweep's own plan (Workload.open_sweep), its counts
        total = workload.open_sent(load)
        warmup = total - workload.open_requests(load)
    # Poisson arrivals by the sweep's own draw (one definition: loadgen's arrival_offsets)
    arrivals = arrival_offsets(workload.open_sweep((load,)), load, total).tolist()
    des = truth.FleetDES(spec, topology)
    draw = random.Random(f"{workload.seed}/lengths")  # apart from the arrivals: a file moves no arrival
    sessions = [des.converse(workload.draw(draw), at, workload.think_time_s) for at in arrivals]
    requests = sum(len(s) for s in sessions)
    finished = [0]
    kv_peak = [0.0]

    def on_done(trace: truth.RequestTrace, now: float) -> None:
        finished[0] += 1
        kv_peak[0] = max(kv_peak[0], *(n.scheduler.kv_usage for n in des.nodes))

    des.on_done = on_done
    des.run(lambda: finished[0] >= requests)
    # The turns sent from the warm-up's end to the last conversation's arrival are counted, each a
    # request: conversations going on at every stage, as in a long run (a single request: those
    # that arrived after the warm-up).
    start, stop = arrivals[warmup], arrivals[-1]
    counted = tuple(trace for session in sessions for trace in session if start <= trace.arrival <= stop)
    # Rates over the sweep's window (loadgen.analysis.summary, as `vllm bench serve` divides by its
    # duration): from the first counted send to the last end, so a prediction reads like a sweep.
    first = min(t.arrival for t in counted)  # a turn of an earlier conversation may come before
    end = max(t.finish or t.arrival for t in counted)
    duration = end - first if end > first else 1.0 / load
    return _point(
        load, counted, duration, slos_ms, kv_peak[0], sum(n.scheduler.preemptions for n in des.nodes)
    )


def open_counts(
    spec: FleetSpec, topology: Topology, workload: Workload, rate: float, slos_ms: Mapping[str, float]
) -> tuple[int, int]:
    """Open loop: (warm-up, counted) conversations at `rate`. The warm-up is the first
    WARMUP_SHARE of the counted ones and, with conversations of several turns, a conversation's life
    (Workload.session_life) of arrivals: until then the turns in flight are only first turns, the
    conversations' later turns still to come, and the load is lower than it stays."""
    counted = workload.open_conversations(rate)
    life = workload.session_life(slos_ms, _decode_step(spec, topology, workload)[0])
    return int(counted * WARMUP_SHARE) + math.ceil(rate * life), counted


def _drawer(workload: Workload) -> Callable[[], truth.Conversation] | None:
    if not workload.conversations:
        return None
    rng = random.Random(f"{workload.seed}/lengths")
    return lambda: workload.draw(rng)


def _closed_point(run: truth.ClosedLoopRun, load: float, slos_ms: Mapping[str, float]) -> Point:
    point = run.point
    duration = len(run.traces) / point.requests_per_s
    out = _point(load, run.traces, duration, slos_ms, run.kv_usage_peak, run.preemptions)
    # Tokens of requests still in flight count too (truth.closed_loop's own throughput).
    return replace(out, output_tps=point.output_tokens_per_s)


def scaled(spec: FleetSpec, factor: float) -> FleetSpec:
    """The spec with every step `factor` times as long (GPU, all-reduce and host time): the band's
    ends, from the profile's step-time error."""
    sim = spec.simulator
    knobs = {
        "gpu_time_scale": sim.gpu_time_scale * factor,
        "host_overhead_step_us": sim.host_overhead_step_us * factor,
        "host_overhead_per_seq_us": sim.host_overhead_per_seq_us * factor,
        "host_overhead_per_seq_per_rank_us": sim.host_overhead_per_seq_per_rank_us * factor,
    }
    return spec.model_copy(update={"simulator": sim.model_copy(update=knobs)})


def _decode_step(
    spec: FleetSpec, topology: Topology, workload: Workload, batch: int = 32
) -> tuple[float, int]:
    """A serving instance's decode step (s) at a batch of `batch` mean-length requests, and how
    many serving instances there are."""
    des = truth.FleetDES(spec, topology)
    model = des.serving[0].scheduler.model
    load = StepLoad(batch, batch * (workload.input_len + workload.output_len // 2))
    return model.step_seconds(load), len(des.serving)


def first_guess(spec: FleetSpec, topology: Topology, workload: Workload) -> float:
    """A load near capacity from the step model alone: the serving instances' decode rate at a
    batch of 32, as conversations per second (open: requests per second over the turns a
    conversation makes) or the concurrency that keeps it busy (closed)."""
    step, serving = _decode_step(spec, topology, workload)
    batch = 32
    rate = serving * batch / (workload.output_len * step)
    if workload.mode is Mode.CLOSED:
        return float(max(1, batch * serving))
    return float(f"{rate / workload.mean_turns:.3g}")  # conversations/s


@dataclass(frozen=True)
class Capacity:
    """The highest load meeting the objective, its bracket (crossings.bracket of the levels
    measured) and the figures at the highest level that met it."""

    load: float | None  # None: misses the objective already at the lowest load tried
    low: float | None
    high: float | None
    censored: str  # "", "below" (misses at the lowest load), "above" (meets at the highest)
    at: Point | None  # the highest measured level that met the objective
    levels: dict[float, float]  # load -> attainment, every level measured


def _level(u: float, mode: Mode) -> float:
    level = mode.unscale(u)
    return float(max(1, round(level))) if mode is Mode.CLOSED else float(f"{level:.3g}")


def find_capacity(
    probe: Callable[[float], Point],
    objective: float,
    mode: Mode,
    guess: float,
    *,
    tolerance: float = 0.03,
    step: float = 2.0,
    lowest: float | None = None,
    highest: float | None = None,
    max_levels: int = 24,
) -> Capacity:
    """Bracket then bisect the load where `probe`'s attainment falls below `objective`: from `guess`
    the load is multiplied (divided) by `step` until the objective is met at one level and missed at
    another, then bisected until the bracket is narrower than `tolerance` of its low end (a
    concurrency: or one apart)."""
    lowest = lowest if lowest is not None else (1.0 if mode is Mode.CLOSED else 1e-3)
    highest = highest if highest is not None else (4096.0 if mode is Mode.CLOSED else 1e5)
    seen: dict[float, Point] = {}

    def at(load: float) -> Point:
        if load not in seen:
            seen[load] = probe(load)
        return seen[load]

    def meets(load: float) -> bool:
        return at(load).attainment >= objective

    x = min(max(_level(mode.scale(guess), mode), lowest), highest)
    ok = fail = None
    while len(seen) < max_levels:
        if meets(x):
            ok = x
            if fail is not None or x >= highest:
                break
            x = (
                max(x + 1, _level(mode.scale(x * step), mode))
                if mode is Mode.CLOSED
                else _level(x * step, mode)
            )
            x = min(highest, x)
        else:
            fail = x
            if ok is not None or x <= lowest:
                break
            x = max(lowest, _level(mode.scale(x / step), mode))
        # Each step out squares the factor: a short first step near the guess (the band's ends), and
        # a layout that misses at any load reaches the lowest in a few levels, not a hundred.
        step *= step
    levels = {k: p.attainment for k, p in sorted(seen.items())}
    if ok is None:
        return Capacity(None, None, min(seen), "below", None, levels)
    if fail is None:
        return Capacity(ok, ok, None, "above", seen[ok], levels)
    while len(seen) < max_levels:
        if fail - ok <= (1 if mode is Mode.CLOSED else 0) or (fail - ok) / ok <= tolerance:
            break
        middle = _level((mode.scale(ok) + mode.scale(fail)) / 2, mode)
        if middle in (ok, fail):
            break
        if meets(middle):
            ok = middle
        else:
            fail = middle
    levels = {k: p.attainment for k, p in sorted(seen.items())}
    # Between the bracket's ends, where the attainment crosses the objective (linear on the scale).
    a_ok, a_fail = seen[ok].attainment, seen[fail].attainment
    share = (a_ok - objective) / (a_ok - a_fail) if a_ok > a_fail else 0.0
    estimate = mode.unscale(mode.scale(ok) + share * (mode.scale(fail) - mode.scale(ok)))
    ends = bracket(list(levels), estimate)
    low, high = ends if ends is not None else (ok, fail)
    return Capacity(estimate, low, high, "", seen[ok], levels)
