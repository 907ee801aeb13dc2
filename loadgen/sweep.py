"""Drive the seeded requests at each load level against each topology, level by level.

Order is level-major (every topology at level 1, then every topology at level 2...) so a sweep
stopped half-way still compares topologies. Each finished (topology, level) is written at once;
a rerun with the same out_dir skips it. An adaptive sweep may measure a level again (a repeat,
with a fresh seed: loadgen.plan.repeat_plan), written to its own file and pooled in the summary.
`stop` (a threading.Event, or anything with is_set()) ends the sweep within ~50 ms, discarding
the unfinished level; `on_level` is called on the sweep's thread after every level with the
summary and crossover so far (the app redraws there).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field, fields, replace
from itertools import chain, islice
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pandas as pd

from crossover.errors import UserError
from crossover.eventloop import loop_factory
from crossover.loadgen.analysis import results
from crossover.loadgen.analysis.adaptive import AdaptivePlan, check_budget, coarse_levels, decide
from crossover.loadgen.analysis.benchjson import BenchOptions, bench_result
from crossover.loadgen.analysis.crossings import analyze
from crossover.loadgen.analysis.report import AdaptiveState, CrossoverReport
from crossover.loadgen.analysis.results import RunInfo
from crossover.loadgen.analysis.serverside import ServerView
from crossover.loadgen.analysis.summary import summarize, summarize_repeats, turn_summary
from crossover.loadgen.plan import DatasetKind, Mode, SweepPlan, TopologyInfo, repeat_plan
from crossover.loadgen.traffic.client import (
    Balancer,
    ClientOptions,
    RequestRecord,
    build_record,
    stream_completion,
)
from crossover.loadgen.traffic.dataset import (
    SyntheticRequest,
    Workload,
    arrival_offsets,
    prepare_workload,
    requests,
)
from crossover.loadgen.traffic.httpclient import HTTPClient
from crossover.loadgen.traffic.payloads import PATHS, request_payload
from crossover.loadgen.traffic.tokens import open_tokenizer
from crossover.loadgen.traffic.workers import Share, WorkerPool, check_workers, shares
from crossover.spec import Balance, FleetSpec, Topology

T = TypeVar("T")


class StopFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class LevelDone:
    """Passed to on_level after each (topology, level): this level's rows and the run so far (resumed
    levels: announced together once every one read so far is analysed)."""

    topology: str
    level: float
    position: int  # 1-based among all (topology, level) jobs of the sweep
    total: int
    resumed: bool  # read from a previous run instead of measured now
    # kept out of repr: asyncio and loggers repr results, and printing frames is slow
    requests: pd.DataFrame = field(repr=False)
    summary: pd.DataFrame = field(repr=False)
    crossover: CrossoverReport = field(repr=False)


@dataclass
class SweepResult:
    out_dir: Path
    info: RunInfo
    requests: pd.DataFrame = field(repr=False)
    summary: pd.DataFrame = field(repr=False)
    crossover: CrossoverReport = field(repr=False)
    stopped: bool = False
    resumed_levels: int = 0
    workload: dict[str, Any] = field(default_factory=dict)  # workload.json: tokenizer, template overhead
    turns: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # per-turn latencies (--turns)
    measured_levels: list[tuple[str, float]] = field(default_factory=list)  # a repeat: its level again
    stop_reason: str = ""  # adaptive: loadgen.report.STOP_REASONS; fixed: "stopped" or ""


RequestCallback = Callable[[str, float, int, "int | None"], None]
Prepared = tuple[SyntheticRequest, bytes]  # a request and the body that sends it
_DURATION_BLOCK = 256  # requests prepared ahead for a closed-loop level that runs for a duration


def tokenizer_urls(spec: FleetSpec, topologies: Sequence[str]) -> list[str]:
    """Where to ask for /tokenize: the chosen topologies' instances first (a load balancer or P/D
    proxy in front of them may not forward it), then their entrypoints."""
    chosen = [spec.topology(name) for name in topologies]
    return ([i.url for t in chosen for i in t.instances]
            + [t.entrypoint.url for t in chosen if t.entrypoint.url is not None])


def open_workload(spec: FleetSpec, plan: SweepPlan, topologies: Sequence[str]) -> Workload:
    """The tokenizer, dataset and chat template, read and checked before any traffic."""
    tokenizer = open_tokenizer(plan.tokenizer, tokenizer_urls(spec, topologies), spec.model.name)
    try:
        workload = prepare_workload(plan, tokenizer, spec.model.max_model_len)
        if plan.dataset is not DatasetKind.RANDOM:
            # every level's dataset prompts counted now (and kept), so a prompt that does not fit the
            # context is an error before any traffic, not in the middle of the sweep
            for level in plan.levels:
                count = plan.conversations_for(level) or len(workload.entries)
                for _ in islice(requests(workload, level), count):
                    pass
        return workload
    finally:
        tokenizer.close()


def prepare_level(workload: Workload, model: str, level: float) -> Iterator[Prepared]:
    """The level's requests with their bodies, made before the level starts: all of them when the
    level has a count, else a first block and the rest as they are needed."""
    plan = workload.plan
    source = requests(workload, level)
    total = plan.conversations_for(level)
    first = list(islice(source, total if total is not None else max(_DURATION_BLOCK, 4 * int(level))))
    ready = [(r, request_payload(model, r, plan.ignore_eos, plan.endpoint)) for r in first]
    workload.tokenizer.close()  # no idle connection to a server while the level runs (reopens if needed)
    if total is not None:
        return iter(ready)
    return chain(ready, ((r, request_payload(model, r, plan.ignore_eos, plan.endpoint)) for r in source))


def topology_info(topology: Topology) -> TopologyInfo:
    if topology.discovered:
        # Its pods (and so its GPUs, which every per-GPU figure divides by) are known only to the
        # cluster; a sweep needs them fixed for its whole run.
        raise UserError(f"topology {topology.name}: a selector topology has no instances or GPU count in "
                        "the spec; sweep it through a spec that lists its pods (docs/kubernetes.md)")
    if topology.entrypoint.url is not None:
        return TopologyInfo(topology.name, topology.gpus, (topology.entrypoint.url,), "entrypoint")
    balance = topology.entrypoint.balance or Balance.ROUND_ROBIN
    return TopologyInfo(topology.name, topology.gpus, tuple(i.url for i in topology.instances), balance.value)


def run_info(spec: FleetSpec, plan: SweepPlan, topologies: Sequence[str] | None) -> RunInfo:
    names = list(topologies) if topologies else [t.name for t in spec.topologies]
    if len(set(names)) != len(names):
        raise UserError(f"topologies: duplicate names in {names}")
    chosen = [spec.topology(name) for name in names]
    return RunInfo(
        plan=plan, slos_ms=dict(plan.slos_ms) if plan.slos_ms else spec.slos.thresholds_ms,
        objective=plan.objective if plan.objective is not None else spec.slos.objective,
        topologies={t.name: topology_info(t) for t in chosen}, model=spec.model.name)


class _LevelRunner:
    """One (topology, level): sends the requests and returns the records."""

    def __init__(self, info: TopologyInfo, model: str, plan: SweepPlan, level: float,
                 on_request: RequestCallback | None, client: ClientOptions,
                 prepared: Iterator[Prepared], turn_tokens: int = 0, share: Share | None = None) -> None:
        policy = Balance.ROUND_ROBIN if info.balance == "entrypoint" else Balance(info.balance)
        self.balancer = Balancer(list(info.targets), policy)
        self.info, self.model, self.plan, self.level = info, model, plan, level
        self.records: list[RequestRecord] = []
        self.on_request = on_request
        self.total = plan.requests_for(level)
        self.client = client
        self.prepared = prepared  # this share's requests (all of them for the one share of one)
        self.share = share = share or Share()
        self.mine = (None if self.total is None else
                     sum(1 for i in range(self.total) if share.owns(plan, level, i)))
        self.turn_tokens = turn_tokens
        self.path = PATHS[plan.endpoint]

    async def _one(self, session: HTTPClient, prepared: Prepared) -> None:
        """One request, or a whole conversation when it has later turns (all to one instance, as a
        session-affine balancer sends them, so a prefix cache sees the history again)."""
        request, payload = prepared
        url = self.balancer.acquire()
        try:
            if request.followups:
                await self._conversation(session, url, request, payload)
            else:
                await self._send(session, url, request, payload)
        finally:
            self.balancer.release(url)

    async def _send(self, session: HTTPClient, url: str, request: SyntheticRequest,
                    payload: bytes, keep_text: bool = False) -> tuple[RequestRecord, str]:
        trace = await stream_completion(session, url, payload, self.plan.timeout_s, path=self.path,
                                        keep_text=keep_text)
        record = build_record(trace, request, self.info.name, self.level, url)
        self.records.append(record)
        if self.on_request is not None:
            self.on_request(self.info.name, self.level, len(self.records), self.total)
        return record, "".join(trace.text or ())

    async def _conversation(self, session: HTTPClient, url: str, request: SyntheticRequest,
                            payload: bytes) -> None:
        """Each turn sends the history, the previous answer and a new user message; its planned
        input is the previous turn's counted input and output plus the new message and template."""
        messages = list(request.messages or [])
        first = request.index
        for turn, follow in enumerate(request.followups, 1):
            record, answer = await self._send(session, url, request, payload, keep_text=True)
            if not record.ok:
                return  # the conversation cannot go on without its answer
            if self.plan.think_time_s > 0:
                await asyncio.sleep(self.plan.think_time_s)
            messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": follow.text}]
            planned = follow.input_after(record.input_tokens, record.output_tokens, self.turn_tokens)
            request = SyntheticRequest(first + turn, follow.text, planned, follow.output_len, list(messages))
            payload = request_payload(self.model, request, self.plan.ignore_eos, self.plan.endpoint)
        await self._send(session, url, request, payload)

    async def run(self) -> list[RequestRecord]:
        async with HTTPClient(kernel_stamps=self.client.kernel_stamps) as session:
            if self.plan.mode is Mode.CLOSED and self.client.preconnect:
                # every stream's first request on a warm connection, as its later ones are
                # (docs/performance.md, bench_clients.py: a cold one read up to 6 ms above the server)
                streams = len(self.share.clients(self.level))
                targets = self.balancer.urls
                per_target = -(-streams // len(targets))  # ceiling: the balancer spreads the streams
                await asyncio.gather(*(session.preconnect(url, per_target) for url in targets))
            if self.plan.mode is Mode.CLOSED:
                await self._closed(session)
            else:
                await self._open(session)
        return self.records

    async def _closed(self, session: HTTPClient) -> None:
        concurrency = int(self.level)
        if self.share.index >= self.share.active(self.plan, self.level):
            return  # fewer clients than shares: this one has none
        source = self.prepared
        deadline = (time.monotonic() + self.plan.ramp_s + self.plan.duration_s
                    if self.plan.duration_s is not None and self.total is None else None)
        issued = 0

        async def worker(number: int) -> None:
            nonlocal issued
            if self.plan.ramp_s > 0:
                await asyncio.sleep(self.plan.ramp_s * number / concurrency)
            while True:
                if self.mine is not None and issued >= self.mine:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                prepared = next(source)
                issued += 1 + len(prepared[0].followups)  # every turn is a request
                await self._one(session, prepared)

        await asyncio.gather(*(worker(n) for n in self.share.clients(self.level)))

    async def _open(self, session: HTTPClient) -> None:
        conversations = self.plan.conversations_for(self.level)
        assert conversations is not None
        # conversations arrive at the rate of requests divided by their turns
        offsets = arrival_offsets(self.plan, self.level / self.plan.turns, conversations)
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        # a share's requests keep their planned arrival (request i at offset i: shares are single-turn)
        planned = (zip(offsets.tolist(), self.prepared, strict=False) if self.share.count == 1 else
                   ((offsets[request[0].index], request) for request in self.prepared))
        for offset, request in planned:
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(session, request)))
        await asyncio.gather(*tasks)


# How often a running level looks at its stop flag: a person waits this long at most, and the client
# wakes this often beside its token events (every wake-up is CPU that bench_clients.py counts).
STOP_POLL_S = 0.25


async def _until_stopped(stop: StopFlag) -> None:
    while not stop.is_set():
        await asyncio.sleep(STOP_POLL_S)


async def _run_or_stop(job: Coroutine[Any, Any, T], stop: StopFlag | None) -> T | None:
    """Run the level; None when stop was set first (the level's task is cancelled)."""
    task = asyncio.ensure_future(job)
    if stop is None:
        return await task
    watcher = asyncio.ensure_future(_until_stopped(stop))
    done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


def records_frame(records: list[RequestRecord], turns: int = 1) -> pd.DataFrame:
    """The requests table; `turn` numbers a request within its conversation (1 when single-turn)."""
    if not records:  # a shard with no client at this level (closed loop, fewer clients than shares)
        return pd.DataFrame(columns=[*(f.name for f in fields(RequestRecord)), "turn"])
    frame = pd.DataFrame.from_records([vars(r) for r in records])
    frame["turn"] = frame["index"] % turns + 1
    return frame.sort_values("index", kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class Traffic:
    """Who sends a level's traffic: `workers` local processes, this machine being `shard` (M, K)."""

    workers: int = 1
    shard: tuple[int, int] = (0, 1)

    def __post_init__(self) -> None:
        check_workers(self.workers)

    @property
    def shares(self) -> list[Share]:
        return shares(self.workers, self.shard)


@dataclass(frozen=True)
class SweepConfig:
    """What one sweep runs with, fixed for its life and built once by its caller (run_sweep_async):
    the fleet, the run folder and what runs there (info: the plan, SLOs and topologies), the
    workload read and checked before any traffic, how this process sends its share of each level,
    what is written beside each level, and the caller's hooks (on_level, on_request, stop: see
    run_sweep)."""

    spec: FleetSpec
    folder: Path
    info: RunInfo
    workload: Workload
    client: ClientOptions = field(default_factory=ClientOptions)
    share: Share = field(default_factory=Share)  # this process's share of each level (all of it: one)
    n_boot: int = 200  # bootstrap resamples behind the intervals
    csv: bool = False  # each level's requests as CSV too
    bench: BenchOptions | None = None  # --save-result: each level as a vllm bench serve result too
    on_level: Callable[[LevelDone], None] | None = None
    on_request: RequestCallback | None = None
    stop: StopFlag | None = None

    @property
    def plan(self) -> SweepPlan:
        return self.info.plan


class _Sweep:
    """One sweep's state: the levels measured or resumed so far, published after each measured one.
    `pool`: the processes that send each level's shares, or None when this one sends it all."""

    def __init__(self, config: SweepConfig, pool: WorkerPool | None = None) -> None:
        self.config, self.pool = config, pool
        self.info, self.plan, self.folder = config.info, config.plan, config.folder  # shorthands
        # a level's requests (by level and seed), made once for every topology
        self.ready: dict[tuple[float, int], list[Prepared]] = {}
        self.frames: list[pd.DataFrame] = []
        report = CrossoverReport(axis=self.plan.mode, objective=self.info.objective,
                                 slos_ms=self.info.slos_ms, bootstrap=config.n_boot)  # nothing found yet
        self.outcome = SweepResult(config.folder, config.info, pd.DataFrame(), pd.DataFrame(), report,
                                   workload=config.workload.describe())
        self.position = 0
        self.spent_requests = 0
        self.spent_s = 0.0
        self.adaptive: AdaptiveState | None = None  # the latest decision, kept in crossover.json
        self.by_repeat = pd.DataFrame()  # summarize_repeats' rows as of the latest analysis
        # (topology, level, position, total, resumed, requests) added but not yet analysed
        self.unannounced: list[tuple[str, float, int, int, bool, pd.DataFrame]] = []

    def _publish(self, name: str, level: float, frame: pd.DataFrame, resumed: bool, total: int) -> None:
        """Add a (topology, level)'s requests. A measured one is analysed and announced at once (the
        app follows it live); resumed ones wait until the next level is measured or the sweep ends,
        so a resume reads every finished level before one analysis instead of analysing after each."""
        if len(frame):  # a shard's empty level: nothing to add (and its columns have no types)
            self.frames.append(frame)
            self.spent_requests += len(frame)
            self.spent_s += float(frame["end_time"].max() - frame["send_time"].min())
        self.unannounced.append((name, level, self.position, total, resumed, frame))
        if not resumed:
            self.flush()

    def flush(self) -> None:
        """Analyse the run so far and announce the levels added since the last analysis (none: no-op)."""
        if not self.unannounced:
            return
        outcome, info, plan = self.outcome, self.info, self.plan
        outcome.requests = pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame()
        outcome.summary = summarize(outcome.requests, info.slos_ms, info.gpus, plan)
        self.by_repeat = summarize_repeats(outcome.requests, info.slos_ms, info.gpus, plan, outcome.summary)
        outcome.crossover = analyze(outcome.summary, outcome.requests, mode=plan.mode,
                                    objective=info.objective, slos_ms=info.slos_ms, plan=plan,
                                    n_boot=self.config.n_boot, seed=plan.seed, order=list(info.topologies),
                                    by_repeat=self.by_repeat)
        self.write_crossover()
        results.write_summary(self.folder, outcome.summary)
        if plan.turns > 1:
            outcome.turns = turn_summary(outcome.requests)
            results.write_turns(self.folder, outcome.turns)
        announced, self.unannounced = self.unannounced, []
        if self.config.on_level is not None:
            for name, level, position, total, resumed, frame in announced:
                self.config.on_level(LevelDone(name, level, position, total, resumed, frame, outcome.summary,
                                        outcome.crossover))

    def write_crossover(self) -> None:
        """crossover.json: the latest analysis, with the latest adaptive decision."""
        if self.adaptive is not None:
            self.outcome.crossover = replace(self.outcome.crossover, adaptive=self.adaptive)
        self.outcome.crossover.write(self.folder)

    def _prepared(self, level: float, plan: SweepPlan) -> Iterator[Prepared]:
        workload = self.config.workload if plan is self.plan else replace(self.config.workload, plan=plan)
        if plan.requests_for(level) is None:
            return prepare_level(workload, self.info.model, level)
        key = (level, plan.seed)
        if key not in self.ready:
            self.ready.clear()
            self.ready[key] = list(prepare_level(workload, self.info.model, level))
        return iter(self.ready[key])

    async def _records(self, name: str, level: float,
                       plan: SweepPlan) -> tuple[list[RequestRecord] | None, dict[str, Any] | None]:
        """The level's records and the servers' figures over it; no records when stopped."""
        prepared = self._prepared(level, plan)
        config = self.config
        view = ServerView(config.spec, name)
        if self.pool is None:
            share = config.share
            mine = (prepared if share.count == 1
                    else (p for p in prepared if share.owns(plan, level, p[0].index)))
            runner = _LevelRunner(self.info.topologies[name], self.info.model, plan, level, config.on_request,
                                  config.client, mine, config.workload.turn_tokens, share=share)
            measured = await _run_or_stop(view.around(runner.run()), config.stop)
            return measured if measured is not None else (None, None)
        total = plan.requests_for(level)
        sent = 0

        def progress(done: int) -> None:
            nonlocal sent
            sent += done
            if config.on_request is not None:
                config.on_request(name, level, sent, total)

        return await view.around(self.pool.run_level(self.info.topologies[name], self.info.model, plan, level,
                                                     list(prepared), config.stop, progress))

    async def level(self, level: float, total: int, repeat: int = 1) -> bool:
        """Every topology at `level` (its `repeat`-th measurement), read back where a previous run
        finished it; False if stopped."""
        plan = repeat_plan(self.plan, repeat)
        for name in self.info.topologies:
            self.position += 1
            path = results.level_path(self.folder, self.plan, name, level, repeat)
            if path.exists():
                frame = results.read_level(path)
                self.outcome.resumed_levels += 1
                self._publish(name, level, frame, True, total)
                continue
            if self.config.stop is not None and self.config.stop.is_set():
                self.outcome.stopped = True
                return False
            self.flush()  # the levels resumed so far, shown while this one runs
            records, server = await self._records(name, level, plan)
            if records is None:
                self.outcome.stopped = True
                return False
            frame = records_frame(records, self.plan.turns).assign(**{results.REPEAT_COLUMN: repeat})
            results.write_level(self.folder, self.plan, name, level, frame, csv=self.config.csv,
                                repeat=repeat)
            if server is not None:
                results.write_json(path.with_suffix(results.SERVER_SUFFIX), server)
            if self.config.bench is not None:  # --save-result: the level as vllm bench serve writes it
                results.write_json(path.with_suffix(".json"), bench_result(
                    frame, topology=name, level=level, mode=self.plan.mode, model=self.info.model,
                    endpoint=self.plan.endpoint.value, tokenizer=self.outcome.workload["tokenizer"],
                    burstiness=self.plan.burstiness, slos_ms=self.info.slos_ms, options=self.config.bench))
            self.outcome.measured_levels.append((name, level))
            self._publish(name, level, frame, False, total)
        return True

    def over_budget(self, adaptive: AdaptivePlan, level: float) -> str:
        """The budget the next level would overspend ("" when it fits)."""
        topologies = len(self.info.topologies)
        cost = self.plan.requests_for(level)
        if (adaptive.max_requests is not None and cost is not None
                and self.spent_requests + cost * topologies > adaptive.max_requests):
            return "max-requests"
        if (adaptive.max_duration_s is not None
                and self.spent_s + self._seconds_for(level) * topologies > adaptive.max_duration_s):
            return "max-duration"
        return ""

    def _seconds_for(self, level: float) -> float:
        """A level's expected length: fixed by the plan, or the nearest measured level's time per
        request times this level's requests (longer than it will be above that level: closed-loop
        throughput grows with concurrency)."""
        summary = self.outcome.summary
        if self.plan.duration_s is not None and self.plan.mode is Mode.CLOSED:
            return self.plan.ramp_s + self.plan.duration_s
        requests_here = self.plan.requests_for(level) or 0
        if self.plan.mode is Mode.OPEN:
            return requests_here / level
        nearest = summary.iloc[(summary["level"] - level).abs().argsort()[:1]]
        per_request = float(nearest["duration_s"].iloc[0]) / max(1, int(nearest["requests_sent"].iloc[0]))
        return per_request * requests_here


async def _adaptive_levels(sweep: _Sweep, adaptive: AdaptivePlan) -> str:
    """The coarse start, then level after level where the widest interval needs it; why it stopped."""
    plan, topologies = sweep.plan, len(sweep.info.topologies)
    levels = list(coarse_levels(plan))
    repeats = {level: 1 for level in levels}
    for level in levels:
        if not await sweep.level(level, len(levels) * topologies):
            return "stopped"
    while True:
        sweep.flush()  # the decision reads the analysis of every level, resumed ones included
        decision = decide(sweep.outcome.crossover, adaptive, plan, levels, sweep.by_repeat)
        reason = decision.stop_reason or (sweep.over_budget(adaptive, decision.level)
                                          if decision.level is not None else "")
        sweep.adaptive = decision.state(reason, levels, repeats, sweep.spent_requests, sweep.spent_s)
        sweep.write_crossover()
        if reason:
            return reason
        assert decision.level is not None
        if decision.level not in repeats:
            levels.append(decision.level)
        repeats[decision.level] = decision.repeat
        jobs = sum(repeats.values()) * topologies
        if not await sweep.level(decision.level, jobs, decision.repeat):
            return "stopped"


async def run_sweep_async(spec: FleetSpec, plan: SweepPlan, out_dir: str | Path,
                          topologies: Sequence[str] | None = None,
                          on_level: Callable[[LevelDone], None] | None = None,
                          stop: StopFlag | None = None, *, on_request: RequestCallback | None = None,
                          csv: bool = False, n_boot: int = 200,
                          client: ClientOptions | None = None, bench: BenchOptions | None = None,
                          adaptive: AdaptivePlan | None = None, traffic: Traffic = Traffic()) -> SweepResult:
    """The sweep on the running event loop; see run_sweep (client.uvloop is the caller's)."""
    folder = Path(out_dir)
    info = run_info(spec, plan, topologies)
    if (traffic.workers > 1 or traffic.shard[1] > 1) and plan.turns > 1:
        raise UserError("--workers, --shard: a multi-turn conversation (--turns) is sent by one process")
    if traffic.workers > 1 and any(plan.requests_for(level) is None for level in plan.levels):
        raise UserError("--workers: a closed-loop level that runs for --duration cannot be split ahead; "
                        "give --requests or --rounds")
    if adaptive is not None:
        check_budget(plan, adaptive, len(info.topologies))
        if n_boot < 1:
            raise UserError("--bootstrap: an adaptive sweep needs intervals, give at least 1 resample")
        if traffic.shard[1] > 1:
            raise UserError("--shard: an adaptive sweep chooses levels from all the records; run it on "
                            "one machine (--workers), or shard a fixed grid")
    extra: dict[str, Any] = {"traffic": {"workers": traffic.workers, "shard": list(traffic.shard)}}
    if adaptive is not None:
        extra["adaptive"] = adaptive.to_json()
    workload = open_workload(spec, plan, list(info.topologies))
    results.prepare(folder, info, extra)
    results.write_json(folder / results.WORKLOAD_FILE, workload.describe())
    share_list = traffic.shares
    config = SweepConfig(spec=spec, folder=folder, info=info, workload=workload,
                         client=client or ClientOptions(), share=share_list[0], n_boot=n_boot, csv=csv,
                         bench=bench, on_level=on_level, on_request=on_request, stop=stop)
    pool = WorkerPool(share_list, config.client) if len(share_list) > 1 else None
    try:
        sweep = _Sweep(config, pool)
        if adaptive is None:
            for level in plan.levels:
                if not await sweep.level(level, len(plan.levels) * len(info.topologies)):
                    break
            sweep.outcome.stop_reason = "stopped" if sweep.outcome.stopped else ""
        else:
            sweep.outcome.stop_reason = await _adaptive_levels(sweep, adaptive)
        sweep.flush()  # levels resumed after the last measured one
        if adaptive is not None and sweep.outcome.stopped and sweep.adaptive is not None:
            sweep.adaptive = replace(sweep.adaptive, stop_reason="stopped", next_level=None)
            sweep.write_crossover()
    finally:
        if pool is not None:
            pool.close()
    return sweep.outcome


def run_sweep(spec: FleetSpec, plan: SweepPlan, out_dir: str | Path, topologies: Sequence[str] | None = None,
              on_level: Callable[[LevelDone], None] | None = None, stop: StopFlag | None = None, *,
              on_request: RequestCallback | None = None, csv: bool = False, n_boot: int = 200,
              client: ClientOptions | None = None, bench: BenchOptions | None = None,
              adaptive: AdaptivePlan | None = None, traffic: Traffic = Traffic()) -> SweepResult:
    """Run a sweep to completion (or until `stop` is set) in a fresh event loop on this thread
    (uvloop's where installed, unless client.uvloop is False: the client's hot path is the loop).

    Safe to call from a background thread (the Streamlit app does): results land in out_dir as
    each level finishes, and on_level is called on this thread after each one. With `adaptive`,
    the plan's levels are the coarse start and the range; the sweep adds levels (see
    loadgen.adaptive) and result.stop_reason says why it stopped. `traffic` spreads each level
    over processes (and machines: see loadgen.workers).
    """
    options = client or ClientOptions()
    with asyncio.Runner(loop_factory=loop_factory("auto" if options.uvloop else "asyncio")) as runner:
        return runner.run(run_sweep_async(spec, plan, out_dir, topologies, on_level, stop,
                                          on_request=on_request, csv=csv, n_boot=n_boot, client=options,
                                          bench=bench, adaptive=adaptive, traffic=traffic))
