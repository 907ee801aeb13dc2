"""Drive the seeded requests at each load level against each topology, level by level.

Order is level-major (every topology at level 1, then every topology at level 2...) so a sweep
stopped half-way still compares topologies. Each finished (topology, level) is written at once;
a rerun with the same out_dir skips it. `stop` (a threading.Event, or anything with is_set())
ends the sweep within ~50 ms, discarding the unfinished level; `on_level` is called on the
sweep's thread after every level with the summary and crossover so far (the app redraws there).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from crossover.errors import UserError
from crossover.eventloop import loop_factory
from crossover.loadgen import results
from crossover.loadgen.benchjson import BenchOptions, bench_result
from crossover.loadgen.client import (
    Balancer,
    ClientOptions,
    RequestRecord,
    build_record,
    stream_completion,
)
from crossover.loadgen.crossings import analyze
from crossover.loadgen.dataset import SyntheticRequest, Workload, arrival_offsets, prepare_workload, requests
from crossover.loadgen.httpclient import HTTPClient
from crossover.loadgen.payloads import PATHS, request_payload
from crossover.loadgen.plan import DatasetKind, Mode, SweepPlan
from crossover.loadgen.results import RunInfo, TopologyInfo
from crossover.loadgen.serverside import ServerView
from crossover.loadgen.summary import summarize, turn_summary
from crossover.loadgen.tokens import open_tokenizer
from crossover.spec import Balance, FleetSpec, Topology


class StopFlag(Protocol):
    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class LevelDone:
    """Passed to on_level after each (topology, level): this level's rows and the run so far."""

    topology: str
    level: float
    position: int  # 1-based among all (topology, level) jobs of the sweep
    total: int
    resumed: bool  # read from a previous run instead of measured now
    # kept out of repr: asyncio and loggers repr results, and printing frames is slow
    requests: pd.DataFrame = field(repr=False)
    summary: pd.DataFrame = field(repr=False)
    crossover: dict[str, Any] = field(repr=False)


@dataclass
class SweepResult:
    out_dir: Path
    info: RunInfo
    requests: pd.DataFrame = field(repr=False)
    summary: pd.DataFrame = field(repr=False)
    crossover: dict[str, Any] = field(repr=False)
    stopped: bool = False
    resumed_levels: int = 0
    workload: dict[str, Any] = field(default_factory=dict)  # workload.json: tokenizer, template overhead
    turns: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # per-turn latencies (--turns)
    measured_levels: list[tuple[str, float]] = field(default_factory=list)


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
                 prepared: Iterator[Prepared], turn_tokens: int = 0,
                 server_view: ServerView | None = None) -> None:
        policy = Balance.ROUND_ROBIN if info.balance == "entrypoint" else Balance(info.balance)
        self.balancer = Balancer(list(info.targets), policy)
        self.info, self.model, self.plan, self.level = info, model, plan, level
        self.records: list[RequestRecord] = []
        self.on_request = on_request
        self.total = plan.requests_for(level)
        self.client = client
        self.prepared = prepared
        self.turn_tokens = turn_tokens
        self.server_view = server_view
        self.server: dict[str, Any] | None = None  # the servers' figures over the level
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
            planned = record.input_tokens + record.output_tokens + follow.tokens + self.turn_tokens
            request = SyntheticRequest(first + turn, follow.text, planned, follow.output_len, list(messages))
            payload = request_payload(self.model, request, self.plan.ignore_eos, self.plan.endpoint)
        await self._send(session, url, request, payload)

    async def run(self) -> list[RequestRecord]:
        before = await self.server_view.scrape_all() if self.server_view else None
        async with HTTPClient(kernel_stamps=self.client.kernel_stamps) as session:
            if self.plan.mode is Mode.CLOSED:
                await self._closed(session)
            else:
                await self._open(session)
        if self.server_view is not None and before is not None:
            self.server = self.server_view.level_figures(before, await self.server_view.scrape_all())
        return self.records

    async def _closed(self, session: HTTPClient) -> None:
        concurrency = int(self.level)
        source = self.prepared
        deadline = (time.monotonic() + self.plan.ramp_s + self.plan.duration_s
                    if self.plan.duration_s is not None and self.total is None else None)
        issued = 0

        async def worker(number: int) -> None:
            nonlocal issued
            if self.plan.ramp_s > 0:
                await asyncio.sleep(self.plan.ramp_s * number / concurrency)
            while True:
                if self.total is not None and issued >= self.total:
                    return
                if deadline is not None and time.monotonic() >= deadline:
                    return
                prepared = next(source)
                issued += 1 + len(prepared[0].followups)  # every turn is a request
                await self._one(session, prepared)

        await asyncio.gather(*(worker(n) for n in range(concurrency)))

    async def _open(self, session: HTTPClient) -> None:
        conversations = self.plan.conversations_for(self.level)
        assert conversations is not None
        # conversations arrive at the rate of requests divided by their turns
        offsets = arrival_offsets(self.plan, self.level / self.plan.turns, conversations)
        loop = asyncio.get_running_loop()
        start = loop.time()
        tasks = []
        for offset, request in zip(offsets.tolist(), self.prepared, strict=False):
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._one(session, request)))
        await asyncio.gather(*tasks)


async def _until_stopped(stop: StopFlag) -> None:
    while not stop.is_set():
        await asyncio.sleep(0.05)


async def _run_or_stop(job: Coroutine[Any, Any, list[RequestRecord]],
                       stop: StopFlag | None) -> list[RequestRecord] | None:
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
    frame = pd.DataFrame.from_records([vars(r) for r in records])
    frame["turn"] = frame["index"] % turns + 1 if len(frame) else pd.Series(dtype=int)
    return frame.sort_values("index", kind="stable").reset_index(drop=True)


async def run_sweep_async(spec: FleetSpec, plan: SweepPlan, out_dir: str | Path,
                          topologies: Sequence[str] | None = None,
                          on_level: Callable[[LevelDone], None] | None = None,
                          stop: StopFlag | None = None, *, on_request: RequestCallback | None = None,
                          csv: bool = False, n_boot: int = 200,
                          client: ClientOptions | None = None,
                          bench: BenchOptions | None = None) -> SweepResult:
    """The sweep on the running event loop; see run_sweep (client.uvloop is the caller's)."""
    folder = Path(out_dir)
    info = run_info(spec, plan, topologies)
    workload = open_workload(spec, plan, list(info.topologies))
    results.prepare(folder, info)
    results.write_json(folder / results.WORKLOAD_FILE, workload.describe())
    ready: dict[float, list[Prepared]] = {}  # a level's requests, made once for every topology
    jobs = [(name, level) for level in plan.levels for name in info.topologies]
    frames: list[pd.DataFrame] = []
    outcome = SweepResult(folder, info, pd.DataFrame(), pd.DataFrame(), {}, workload=workload.describe())

    def publish(name: str, level: float, position: int, frame: pd.DataFrame, resumed: bool) -> None:
        frames.append(frame)
        outcome.requests = pd.concat(frames, ignore_index=True)
        outcome.summary = summarize(outcome.requests, info.slos_ms, info.gpus, plan)
        outcome.crossover = analyze(outcome.summary, outcome.requests, axis=plan.axis,
                                    objective=info.objective, slos_ms=info.slos_ms, plan=plan, n_boot=n_boot,
                                    seed=plan.seed, order=list(info.topologies))
        results.write_summary(folder, outcome.summary)
        if plan.turns > 1:
            outcome.turns = turn_summary(outcome.requests)
            results.write_turns(folder, outcome.turns)
        results.write_json(folder / results.CROSSOVER_FILE, outcome.crossover)
        if on_level is not None:
            on_level(LevelDone(name, level, position, len(jobs), resumed, frame, outcome.summary,
                               outcome.crossover))

    for position, (name, level) in enumerate(jobs, 1):
        path = results.level_path(folder, plan, name, level)
        if path.exists():
            frame = pd.read_parquet(path)
            for column in results.LIST_COLUMNS:
                frame[column] = frame[column].map(list)
            outcome.resumed_levels += 1
            publish(name, level, position, frame, resumed=True)
            continue
        if stop is not None and stop.is_set():
            outcome.stopped = True
            break
        if plan.requests_for(level) is None:
            prepared = prepare_level(workload, info.model, level)
        else:
            if level not in ready:
                ready.clear()
                ready[level] = list(prepare_level(workload, info.model, level))
            prepared = iter(ready[level])
        runner = _LevelRunner(info.topologies[name], info.model, plan, level, on_request,
                              client or ClientOptions(), prepared, workload.turn_tokens,
                              ServerView(spec, name))
        records = await _run_or_stop(runner.run(), stop)
        if records is None:
            outcome.stopped = True
            break
        frame = records_frame(records, plan.turns)
        results.write_level(folder, plan, name, level, frame, csv=csv)
        if runner.server is not None:
            results.write_json(path.with_suffix(results.SERVER_SUFFIX), runner.server)
        if bench is not None:  # --save-result: the level as vllm bench serve writes it, beside its table
            results.write_json(path.with_suffix(".json"), bench_result(
                frame, topology=name, level=level, axis=plan.axis, model=info.model,
                endpoint=plan.endpoint.value, tokenizer=outcome.workload["tokenizer"],
                burstiness=plan.burstiness, slos_ms=info.slos_ms, options=bench))
        outcome.measured_levels.append((name, level))
        publish(name, level, position, frame, resumed=False)
    return outcome


def run_sweep(spec: FleetSpec, plan: SweepPlan, out_dir: str | Path, topologies: Sequence[str] | None = None,
              on_level: Callable[[LevelDone], None] | None = None, stop: StopFlag | None = None, *,
              on_request: RequestCallback | None = None, csv: bool = False, n_boot: int = 200,
              client: ClientOptions | None = None, bench: BenchOptions | None = None) -> SweepResult:
    """Run a sweep to completion (or until `stop` is set) in a fresh event loop on this thread
    (uvloop's where installed, unless client.uvloop is False: the client's hot path is the loop).

    Safe to call from a background thread (the Streamlit app does): results land in out_dir as
    each level finishes, and on_level is called on this thread after each one.
    """
    options = client or ClientOptions()
    with asyncio.Runner(loop_factory=loop_factory("auto" if options.uvloop else "asyncio")) as runner:
        return runner.run(run_sweep_async(spec, plan, out_dir, topologies, on_level, stop,
                                          on_request=on_request, csv=csv, n_boot=n_boot, client=options,
                                          bench=bench))
