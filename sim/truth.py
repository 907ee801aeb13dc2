"""Ground truth without traffic: the performance model run in virtual time.

The same `Scheduler` and `PerfModel` the live servers use are stepped by a discrete-event loop with
no sleeping, so the figures here are exactly what the simulator serves, minus wall-clock jitter:
closed-loop throughput, TTFT and TPOT at a concurrency, open-loop (Poisson) latency distributions,
and the concurrency where one topology's aggregate output tokens/s overtakes another's.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from crossover import slo
from crossover.sim.model import PerfModel, StepLoad
from crossover.sim.scheduler import Scheduler, SimRequest, StepPlan, chained_block_hashes
from crossover.spec import FleetSpec, Role, Topology


@dataclass
class RequestTrace:
    """One client request as the client sees it (times in virtual seconds)."""

    arrival: float
    prompt_tokens: int
    output_tokens: int
    first_token: float | None = None
    finish: float | None = None
    token_times: list[float] = field(default_factory=list)
    block_hashes: tuple[int, ...] = ()  # the prompt's prefix-cache keys (none: nothing to reuse)
    cached_tokens: int = 0  # prompt tokens the prefix cache held at admission
    # what follows the request's end (a conversation's next turn), called with the end time
    then: Callable[[float], None] | None = field(default=None, repr=False, compare=False)

    @property
    def ttft(self) -> float:
        assert self.first_token is not None
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float:
        """vllm bench serve's per-request TPOT: (e2e - TTFT) / (output - 1), 0 for one token."""
        assert self.finish is not None and self.first_token is not None
        return slo.tpot(self.finish - self.first_token, len(self.token_times))

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in itertools.pairwise(self.token_times)]


@dataclass(frozen=True)
class Turn:
    """One request of a conversation: its whole prompt (the history and the new message), its
    answer's length and the prompt's prefix-cache block hashes."""

    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[int, ...] = ()


Conversation = tuple[Turn, ...]  # a session's requests in order; a single request is one turn


def conversation(messages: Sequence[Sequence[Hashable]], answers: Sequence[Sequence[Hashable]],
                 prompt_tokens: Sequence[int], output_tokens: Sequence[int], block_size: int) -> Conversation:
    """A conversation's turns: turn k's prompt is messages[0], answers[0], ..., answers[k-1],
    messages[k] (the keys the server hashes, in order), so its block hashes chain over the whole
    history and its leading blocks are turn k-1's prompt's: the prefix cache holds them."""
    keys: list[Hashable] = []
    turns = []
    for k, (new, tokens, output) in enumerate(zip(messages, prompt_tokens, output_tokens, strict=True)):
        if k:
            keys += answers[k - 1]
        keys += new
        turns.append(Turn(tokens, output, chained_block_hashes(keys, block_size)))
    return tuple(turns)


@dataclass
class _Node:
    name: str
    role: Role
    scheduler: Scheduler
    plan: StepPlan | None = None
    wake_at: float | None = None


class FleetDES:
    """A discrete-event run of one topology: instances step independently; P/D requests go prefill
    instance -> KV transfer (on the decoder) -> decode instance, as the live proxy routes them."""

    def __init__(self, spec: FleetSpec, topology: Topology) -> None:
        # One model per TP size: a P/D topology's roles may shard the model differently.
        models = {tp: PerfModel.for_instance(spec, tp) for tp in topology.tp_sizes}
        self.nodes = [_Node(i.name, i.role, Scheduler(models[topology.tp_of(i)])) for i in topology.instances]
        self.prefill = [n for n in self.nodes if n.role is Role.PREFILL]
        self.serving = [n for n in self.nodes if n.role is not Role.PREFILL]  # colocated or decode
        self.model = self.serving[0].scheduler.model  # the serving side's (closed_loop's pacing)
        self._events: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self._ids = itertools.count()
        self.now = 0.0
        self.on_done: Callable[[RequestTrace, float], None] = lambda trace, t: None
        self._rr_entry = itertools.cycle(self.prefill or self.serving)
        self._rr_decode = itertools.cycle(self.serving)

    def at(self, time: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._events, (time, next(self._seq), action))

    def submit(self, trace: RequestTrace, node: _Node | None = None) -> None:
        """A client request arriving at trace.arrival, at the topology's entry (or a given instance)."""
        target = node or next(self._rr_entry)
        disaggregated = target.role is Role.PREFILL
        request = SimRequest(f"r{next(self._ids)}", trace.prompt_tokens,
                             1 if disaggregated else trace.output_tokens, trace.arrival,
                             block_hashes=trace.block_hashes)
        request.sink = trace
        self.at(trace.arrival, lambda t: self._arrive(target, request))

    def converse(self, turns: Conversation, at: float, think_time_s: float = 0.0, node: _Node | None = None,
                 on_end: Callable[[float], None] | None = None) -> list[RequestTrace]:
        """A conversation starting at `at`: turn k+1 is sent when turn k's answer has ended plus the
        think time, every turn to one entry instance (the sweep's client sends a conversation to one
        URL), so its history is in that instance's prefix cache; through a P/D proxy (no `node`) each
        turn goes to the next prefill instance, as the proxy sends each request (pdproxy/proxy.py,
        round robin). `on_end(t)` when the last turn ends."""
        target = node or (None if self.prefill else next(self._rr_entry))
        traces = [RequestTrace(at, t.prompt_tokens, t.output_tokens, block_hashes=t.block_hashes)
                  for t in turns]

        def send(k: int, when: float) -> None:
            trace = traces[k]
            trace.arrival = when
            trace.then = (lambda end: send(k + 1, end + think_time_s)) if k + 1 < len(traces) else on_end
            self.submit(trace, target)

        send(0, at)
        return traces

    def _arrive(self, node: _Node, request: SimRequest) -> None:
        node.scheduler.add(request)
        self._kick(node)

    def _kick(self, node: _Node) -> None:
        if node.plan is not None:
            return
        plan = node.scheduler.plan(self.now)
        if plan is not None:
            node.plan = plan
            self.at(self.now + plan.seconds, lambda t: self._step_end(node))
            return
        ready = node.scheduler.next_kv_ready()
        if ready is not None and node.wake_at != ready:
            node.wake_at = ready
            self.at(ready, lambda t: self._kick(node))

    def _step_end(self, node: _Node) -> None:
        plan, node.plan = node.plan, None
        assert plan is not None
        outcome = node.scheduler.complete(plan, self.now)
        for request in outcome.emitted:
            trace: RequestTrace = request.sink
            if node.role is Role.PREFILL:
                continue  # the prefill's token goes back to the proxy, not to the client
            trace.token_times.append(self.now)
            if trace.first_token is None:
                trace.first_token = self.now
        for request in outcome.finished:
            trace = request.sink
            if not request.remote_kv:  # P/D: the prefill instance's cache hits, not the decoder's
                trace.cached_tokens = request.cached_tokens
            if node.role is Role.PREFILL:
                decode = SimRequest(f"r{next(self._ids)}", trace.prompt_tokens, trace.output_tokens,
                                    self.now, remote_kv=True)
                decode.sink = trace
                target = next(self._rr_decode)
                self._arrive(target, decode)
            else:
                trace.finish = self.now
                self.on_done(trace, self.now)
                if trace.then is not None:
                    trace.then(self.now)
        self._kick(node)

    def run(self, until: Callable[[], bool], max_time: float = 1e7) -> None:
        while self._events and not until():
            time, _, action = heapq.heappop(self._events)
            if time > max_time:
                break
            self.now = time
            action(time)


@dataclass(frozen=True)
class ClosedLoopPoint:
    """Steady state of `concurrency` clients each sending the next request when the last one ends."""

    concurrency: int
    output_tokens_per_s: float
    ttft_s: float  # mean
    tpot_s: float  # mean
    requests_per_s: float


def _topology(spec: FleetSpec, topology: Topology | str) -> Topology:
    return spec.topology(topology) if isinstance(topology, str) else topology


def closed_loop(spec: FleetSpec, topology: Topology | str, concurrency: int, input_len: int,
                output_len: int) -> ClosedLoopPoint:
    """Closed-loop steady state from the model alone (virtual time, deterministic)."""
    return closed_loop_run(spec, topology, concurrency, input_len, output_len).point


@dataclass(frozen=True)
class ClosedLoopRun:
    """A closed-loop run's steady state and the requests it counted (those finished in its window)."""

    point: ClosedLoopPoint
    traces: tuple[RequestTrace, ...]
    preemptions: int  # over every instance, warm-up included
    kv_usage_peak: float  # the highest KV-block share any instance held at a request's end


def closed_loop_run(spec: FleetSpec, topology: Topology | str, concurrency: int, input_len: int,
                    output_len: int, measured: int | None = None,
                    draw: Callable[[], Conversation] | None = None,
                    think_time_s: float = 0.0, warmup: int | None = None) -> ClosedLoopRun:
    """closed_loop with the counted requests kept (per-request SLO checks); `measured` requests are
    counted after `warmup` ones (defaults: 4 x concurrency, at least 40, after 2 x concurrency). `draw()`
    makes each client's next conversation when they vary (a workload file's turns, lengths and prefix
    hashes): a client sends its turns one after another, `think_time_s` after each answer, and starts
    the next conversation when the last turn ends (every turn is a request); input_len and output_len
    then only pace the clients' first sends (their means)."""
    topo = _topology(spec, topology)
    if concurrency < 1 or input_len < 1 or output_len < 1:
        raise ValueError("concurrency, input_len and output_len must be positive")
    des = FleetDES(spec, topo)
    serving = des.serving
    # Spread the first arrivals over one request's expected life so the clients start out of step,
    # as they are in a long run (otherwise every client prefills in the same step, cycle after cycle).
    per_instance = max(1, concurrency // len(serving))
    decode_step = des.model.step_seconds(StepLoad(per_instance, per_instance * (input_len + output_len // 2)))
    life = output_len * decode_step
    warmup = 2 * concurrency if warmup is None else warmup
    measured = max(4 * concurrency, 40) if measured is None else measured
    done: list[tuple[float, RequestTrace]] = []
    entries = des.prefill or serving
    kv_peak = [0.0]
    single = (Turn(input_len, output_len),)

    def issue(client: int, at: float) -> None:
        des.converse(draw() if draw else single, at, think_time_s, entries[client % len(entries)],
                     lambda end: issue(client, end))

    def on_done(trace: RequestTrace, now: float) -> None:
        done.append((now, trace))
        kv_peak[0] = max(kv_peak[0], *(n.scheduler.kv_usage for n in des.nodes))

    des.on_done = on_done
    for client in range(concurrency):
        issue(client, client * life / concurrency)
    des.run(lambda: len(done) >= warmup + measured)
    start = done[warmup - 1][0]
    window = done[warmup:]
    end = window[-1][0]
    tokens = sum(sum(1 for t in trace.token_times if start < t <= end) for _, trace in done)
    # Requests still in flight also emitted tokens inside the window.
    tokens += sum(sum(1 for t in trace.token_times if start < t <= end)
                  for node in serving
                  for r in (*node.scheduler.running, *node.scheduler.waiting, *node.scheduler.transferring)
                  if isinstance((trace := r.sink), RequestTrace))
    duration = end - start
    point = ClosedLoopPoint(
        concurrency=concurrency,
        output_tokens_per_s=tokens / duration,
        ttft_s=sum(t.ttft for _, t in window) / len(window),
        tpot_s=sum(t.tpot for _, t in window) / len(window),
        requests_per_s=len(window) / duration,
    )
    return ClosedLoopRun(point, tuple(t for _, t in window), sum(n.scheduler.preemptions for n in des.nodes),
                         kv_peak[0])


def throughput(spec: FleetSpec, topology: Topology | str, concurrency: int, input_len: int,
               output_len: int) -> float:
    """Aggregate output tokens/s of a topology at a closed-loop concurrency."""
    return closed_loop(spec, topology, concurrency, input_len, output_len).output_tokens_per_s


def tpot(spec: FleetSpec, topology: Topology | str, concurrency: int, input_len: int,
         output_len: int) -> float:
    """Mean per-request time per output token (s) at a closed-loop concurrency."""
    return closed_loop(spec, topology, concurrency, input_len, output_len).tpot_s


def ttft(spec: FleetSpec, topology: Topology | str, concurrency: int, input_len: int,
         output_len: int) -> float:
    """Mean time to first token (s) at a closed-loop concurrency."""
    return closed_loop(spec, topology, concurrency, input_len, output_len).ttft_s


def ground_truth_crossover(spec: FleetSpec, topology_a: Topology | str, topology_b: Topology | str,
                           input_len: int, output_len: int, concurrencies: Sequence[int]) -> float | None:
    """The concurrency where topology_b's aggregate output tokens/s overtakes topology_a's.

    Evaluated at the given concurrencies; inside the first bracket where b goes from not ahead to
    ahead, integer concurrencies are bisected and the crossing is interpolated linearly between the
    last integer where a leads and the first where b leads. None when b never overtakes a in the
    range (including when b leads from the first concurrency on: no crossover inside the range).
    """
    levels = sorted(set(concurrencies))
    if not levels:
        raise ValueError("give at least one concurrency")

    def lead(c: int) -> float:
        return (throughput(spec, topology_b, c, input_len, output_len)
                - throughput(spec, topology_a, c, input_len, output_len))

    previous: tuple[int, float] | None = None
    for level in levels:
        diff = lead(level)
        if previous is not None and previous[1] <= 0 < diff:
            low, low_diff = previous
            high, high_diff = level, diff
            while high - low > 1:
                middle = (low + high) // 2
                middle_diff = lead(middle)
                if middle_diff > 0:
                    high, high_diff = middle, middle_diff
                else:
                    low, low_diff = middle, middle_diff
            return low + (high - low) * (-low_diff) / (high_diff - low_diff)
        if diff > 0 and previous is None:
            return None
        previous = (level, diff)
    return None


@dataclass(frozen=True)
class OpenLoopResult:
    """Latencies of Poisson traffic at a request rate (times in seconds)."""

    rate: float
    traces: tuple[RequestTrace, ...]

    def itl_quantile(self, q: float) -> float:
        values = sorted(x for t in self.traces for x in t.itls)
        return values[min(len(values) - 1, max(0, math.ceil(q * len(values)) - 1))]

    def attainment(self, ttft_s: float | None, tpot_s: float | None) -> float:
        """Share of requests meeting every SLO given (crossover.slo.is_good; every request here
        finishes, the ground truth has no failures)."""
        thresholds = {kind: s for kind, s in (("ttft", ttft_s), ("tpot", tpot_s)) if s is not None}
        good = sum(1 for t in self.traces if slo.is_good(True, {"ttft": t.ttft, "tpot": t.tpot}, thresholds))
        return good / len(self.traces)


def open_loop(spec: FleetSpec, topology: Topology | str, rate: float, input_len: int, output_len: int,
              num_requests: int = 100, seed: int | None = None) -> OpenLoopResult:
    """Poisson arrivals at `rate` req/s (like `vllm bench serve --request-rate`), round robin."""
    rng = random.Random(spec.simulator.seed if seed is None else seed)
    arrivals = list(itertools.accumulate(rng.expovariate(rate) for _ in range(num_requests)))
    return replay(spec, topology, arrivals, input_len, output_len, rate)


def replay(spec: FleetSpec, topology: Topology | str, arrivals: Sequence[float], input_len: int,
           output_len: int, rate: float | None = None) -> OpenLoopResult:
    """Requests sent at `arrivals` (seconds), round robin: the model fed a live level's own send
    times, to tell the simulator's reads from its arrival sequence's."""
    des = FleetDES(spec, _topology(spec, topology))
    traces = tuple(RequestTrace(at, input_len, output_len) for at in arrivals)
    for trace in traces:
        des.submit(trace)
    finished = [0]

    def on_done(trace: RequestTrace, now: float) -> None:
        finished[0] += 1

    des.on_done = on_done
    des.run(lambda: finished[0] >= len(traces))
    if rate is None:  # the rate the sends kept: gaps per second between the first and the last
        span = max(arrivals) - min(arrivals) if arrivals else 0.0
        rate = (len(arrivals) - 1) / span if span else 0.0
    return OpenLoopResult(rate, traces)


def conversation_ttfts(spec: FleetSpec, topology: Topology | str, turns: int, input_len: int, output_len: int,
                       *, prefix_caching: bool = True) -> list[float]:
    """TTFT of each turn of one conversation on one instance: turn k's prompt is every earlier prompt
    and answer plus `input_len` new tokens, so the prefix cache holds all but the newest part."""
    if turns < 1 or input_len < 1 or output_len < 1:
        raise ValueError("turns, input_len and output_len must be positive")
    des = FleetDES(spec, _topology(spec, topology))
    messages = [[f"u{turn}-{i}" for i in range(input_len)] for turn in range(turns)]
    answers = [[f"a{turn}-{i}" for i in range(output_len)] for turn in range(turns)]
    prompts = [(k + 1) * input_len + k * output_len for k in range(turns)]
    talk = conversation(messages, answers, prompts, [output_len] * turns, des.model.block_size)
    if not prefix_caching:
        talk = tuple(Turn(t.prompt_tokens, t.output_tokens) for t in talk)
    traces = des.converse(talk, 0.0, node=des.serving[0])
    des.run(lambda: traces[-1].finish is not None)
    return [trace.ttft for trace in traces]
