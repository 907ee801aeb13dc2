"""The run folder: written level by level so a killed sweep resumes, and read back by `load_run`.

    OUT/run.json                       plan, SLOs, topologies (GPUs, where traffic went)
    OUT/levels/TOPOLOGY/LEVEL.parquet  one file per finished (topology, level): the requests table
    OUT/levels/TOPOLOGY/LEVEL.repeatN.parquet  the level's Nth measurement (adaptive repeats), pooled with it
    OUT/levels/TOPOLOGY/LEVEL.csv      the same, when CSV was asked for
    OUT/levels/TOPOLOGY/LEVEL.server.json  the servers' own figures over the level (their /metrics)
    OUT/levels/TOPOLOGY/LEVEL.json     the level as a vllm bench serve result (--save-result)
    OUT/summary.parquet, summary.csv   per topology x level (rewritten after every level)
    OUT/crossover.json                 crossings and capacities (rewritten after every level; its
                                       one reader and writer is loadgen.report.CrossoverReport)
    OUT/workload.json                  the tokenizer, endpoint, dataset and chat-template overhead
    OUT/turns.csv                      per topology x level x turn: TTFT and ITL (multi-turn sweeps)

Every file is written to a temporary name and renamed, so a crash never leaves half a file that a
rerun would take for a finished level.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from crossover.errors import UserError
from crossover.loadgen.plan import SweepPlan, TopologyInfo, level_key

if TYPE_CHECKING:  # the report writes itself through this module's write_json
    from crossover.loadgen.analysis.report import CrossoverReport

RUN_FILE = "run.json"
LEVELS_DIR = "levels"
SUMMARY_FILE = "summary.parquet"
SUMMARY_CSV = "summary.csv"
WORKLOAD_FILE = "workload.json"
TURNS_CSV = "turns.csv"
SERVER_SUFFIX = ".server.json"
LIST_COLUMNS = ("itl", "chunk_times", "chunk_tokens")
REPEAT_COLUMN = "repeat"  # which measurement of its level a request belongs to (1 for the first)


@dataclass(frozen=True)
class RunInfo:
    plan: SweepPlan
    slos_ms: dict[str, float]
    objective: float
    topologies: dict[str, TopologyInfo]
    model: str

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.plan.to_json(), "slos_ms": self.slos_ms, "objective": self.objective,
            "model": self.model,
            "topologies": {name: {"gpus": t.gpus, "targets": list(t.targets), "balance": t.balance}
                           for name, t in self.topologies.items()},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunInfo:
        return cls(
            plan=SweepPlan.from_json(data["plan"]), slos_ms={k: float(v) for k, v in data["slos_ms"].items()},
            objective=float(data["objective"]), model=str(data["model"]),
            topologies={name: TopologyInfo(name, int(t["gpus"]), tuple(t["targets"]), str(t["balance"]))
                        for name, t in data["topologies"].items()})

    @property
    def gpus(self) -> dict[str, int]:
        return {name: t.gpus for name, t in self.topologies.items()}


@dataclass
class Run:
    """A past (or running) sweep as DataFrames."""

    out_dir: Path
    info: RunInfo
    requests: pd.DataFrame = field(repr=False)
    summary: pd.DataFrame = field(repr=False)
    crossover: CrossoverReport = field(repr=False)
    turns: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # per-turn latencies (--turns)
    server: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)  # the servers' figures per level


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(temporary)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_json(path: Path, data: Any) -> None:
    _atomic_write(path, lambda p: p.write_text(json.dumps(data, indent=2, default=str) + "\n"))


def level_path(out_dir: Path, plan: SweepPlan, topology: str, level: float, repeat: int = 1) -> Path:
    return out_dir / LEVELS_DIR / topology / f"{level_key(plan, level, repeat)}.parquet"


def level_done(out_dir: Path, plan: SweepPlan, topology: str, level: float) -> bool:
    return level_path(out_dir, plan, topology, level).exists()


def read_level(path: Path) -> pd.DataFrame:
    """One level file's requests as the sweep made them (a file from before repeats: repeat 1)."""
    return with_repeat(pd.read_parquet(path))


def with_repeat(requests: pd.DataFrame) -> pd.DataFrame:
    for column in LIST_COLUMNS:
        if column in requests:
            requests[column] = requests[column].map(list)
    if REPEAT_COLUMN not in requests:
        requests[REPEAT_COLUMN] = 1
    requests[REPEAT_COLUMN] = requests[REPEAT_COLUMN].fillna(1).astype(int)
    return requests


def prepare(out_dir: Path, info: RunInfo, extra: dict[str, Any] | None = None) -> None:
    """Start or resume a run in out_dir; refuse to mix two different plans, or two shards, in one
    folder. `extra` is kept beside the plan: "adaptive" (its target and budgets may change between
    runs: a resumed sweep may go on further) and "traffic" (workers, and this machine's shard)."""
    path = out_dir / RUN_FILE
    extra = extra or {}
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: cannot read the previous run's plan ({exc})") from None
        if previous.get("plan") != info.plan.to_json():
            raise UserError(f"{out_dir}: holds a run with a different plan; use another --out to start "
                            "a new one (or the same options to resume it)")
        shard, before = shard_of(extra), shard_of(previous)
        if shard != before:
            raise UserError(f"--shard: {out_dir} holds shard {before[0]}/{before[1]}'s requests, not "
                            f"{shard[0]}/{shard[1]}'s; use another --out")
        merged = {**previous.get("topologies", {}), **info.to_json()["topologies"]}
        write_json(path, {**info.to_json(), **extra, "topologies": merged})
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"--out {out_dir}: cannot create the folder ({exc.strerror})") from None
    write_json(path, {**info.to_json(), **extra})


def shard_of(run: dict[str, Any]) -> tuple[int, int]:
    """(M, K) of a run.json's "traffic": machine M of K; (0, 1) for a run from one machine."""
    shard = (run.get("traffic") or {}).get("shard") or (0, 1)
    return int(shard[0]), int(shard[1])


def write_level(out_dir: Path, plan: SweepPlan, topology: str, level: float, requests: pd.DataFrame,
                csv: bool = False, repeat: int = 1) -> None:
    path = level_path(out_dir, plan, topology, level, repeat)
    _atomic_write(path, lambda p: requests.to_parquet(p, index=False))
    if csv:
        flat = requests.copy()
        for column in LIST_COLUMNS:
            flat[column] = flat[column].map(lambda v: json.dumps(list(v)))
        _atomic_write(path.with_suffix(".csv"), lambda p: flat.to_csv(p, index=False))


def write_turns(out_dir: Path, turns: pd.DataFrame) -> None:
    _atomic_write(out_dir / TURNS_CSV, lambda p: turns.to_csv(p, index=False))


def write_summary(out_dir: Path, summary: pd.DataFrame) -> None:
    _atomic_write(out_dir / SUMMARY_FILE, lambda p: summary.to_parquet(p, index=False))
    _atomic_write(out_dir / SUMMARY_CSV, lambda p: summary.to_csv(p, index=False))


def read_requests(out_dir: Path) -> pd.DataFrame:
    files = sorted((out_dir / LEVELS_DIR).glob("*/*.parquet"))
    if not files:
        return pd.DataFrame()
    frames = [frame for frame in (pd.read_parquet(f) for f in files) if len(frame)]  # a shard's empty levels
    if not frames:
        return pd.DataFrame()
    requests = with_repeat(pd.concat(frames, ignore_index=True))
    order = ["topology", "level", REPEAT_COLUMN, "index"]
    return requests.sort_values(order, kind="stable").reset_index(drop=True)


def read_server_views(out_dir: Path, plan: SweepPlan, requests: pd.DataFrame) -> pd.DataFrame:
    """The servers' figures of every finished level (LEVEL.server.json beside the level's requests;
    `requests` as read_requests gives them, so no level file is read again), one row per level."""
    from crossover.loadgen.analysis.serverside import server_frame

    if requests.empty:
        return server_frame([])
    views = []
    levels = requests[["topology", "level", REPEAT_COLUMN]].drop_duplicates()
    for topology, level, repeat in levels.itertuples(index=False):
        path = level_path(out_dir, plan, topology, float(level), int(repeat)).with_suffix(SERVER_SUFFIX)
        try:
            views.append((path, (str(topology), float(level), json.loads(path.read_text()))))
        except (OSError, ValueError):
            continue  # a level measured without the servers' view
    return server_frame([view for _, view in sorted(views, key=lambda found: found[0])])


def read_info(folder: Path) -> RunInfo:
    """A run folder's plan, SLOs and topologies (run.json); UserError when it has none."""
    path = folder / RUN_FILE
    if not path.exists():
        raise UserError(f"{folder}: not a sweep folder (no {RUN_FILE})")
    try:
        return RunInfo.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc})") from None


def load_run(out_dir: str | os.PathLike[str]) -> Run:
    """Open a past run: its plan, every finished level's requests, the summary and crossover."""
    folder = Path(out_dir)
    info = read_info(folder)
    from crossover.loadgen.analysis.report import CrossoverReport
    from crossover.loadgen.analysis.summary import summarize, turn_summary  # recomputed, never trusted stale

    requests = read_requests(folder)
    summary = summarize(requests, info.slos_ms, info.gpus, info.plan)
    crossover = CrossoverReport.read(folder) or CrossoverReport(  # none yet: nothing found
        axis=info.plan.mode, objective=info.objective, slos_ms=info.slos_ms)
    return Run(folder, info, requests, summary, crossover, turn_summary(requests),
               read_server_views(folder, info.plan, requests))


def merge_runs(folders: list[Path], out_dir: Path, n_boot: int = 200) -> Run:
    """One run folder from the folders of one plan's shards (`crossover sweep --shard M/K` on K
    machines): each (topology, level)'s requests concatenated in index order, the summary and the
    crossover computed from all of them. Every shard must be there exactly once."""
    from crossover.loadgen.analysis.crossings import analyze
    from crossover.loadgen.analysis.summary import summarize

    runs: list[tuple[Path, dict[str, Any]]] = []
    for folder in folders:
        try:
            runs.append((folder, json.loads((folder / RUN_FILE).read_text())))
        except (OSError, ValueError) as exc:
            raise UserError(f"{folder}: not a sweep folder ({exc})") from None
    first_folder, first = runs[0]
    for folder, data in runs[1:]:
        if data.get("plan") != first.get("plan"):
            raise UserError(f"{folder}: another plan than {first_folder}'s; only shards of one plan merge")
    shards = sorted(shard_of(data) for _, data in runs)
    machines = shards[0][1]
    if shards != [(m, machines) for m in range(machines)]:
        raise UserError(f"shards: want each of 0/{machines} to {machines - 1}/{machines} once, got "
                        f"{', '.join(f'{m}/{k}' for m, k in shards)}")
    topologies = {name: t for _, data in runs for name, t in data.get("topologies", {}).items()}
    info = RunInfo.from_json({**first, "topologies": topologies})
    prepare(out_dir, info, {"traffic": {"workers": sum((d.get("traffic") or {}).get("workers", 1)
                                                       for _, d in runs), "shard": [0, 1]}})
    names = sorted({p.relative_to(f) for f, _ in runs for p in (f / LEVELS_DIR).glob("*/*.parquet")})
    for name in names:
        frames = [frame for f, _ in runs if (f / name).exists() and len(frame := pd.read_parquet(f / name))]
        if not frames:
            continue
        merged = pd.concat(frames, ignore_index=True).sort_values("index", kind="stable")
        merged = merged.reset_index(drop=True)
        if merged["index"].duplicated().any():
            raise UserError(f"{name}: the same request in two folders (one shard given twice?)")
        topology, level = str(merged["topology"].iloc[0]), float(merged["level"].iloc[0])
        repeat = int(merged[REPEAT_COLUMN].iloc[0]) if REPEAT_COLUMN in merged else 1
        write_level(out_dir, info.plan, topology, level, merged, repeat=repeat)
    requests = read_requests(out_dir)
    summary = summarize(requests, info.slos_ms, info.gpus, info.plan)
    crossover = analyze(summary, requests, mode=info.plan.mode, objective=info.objective,
                        slos_ms=info.slos_ms, plan=info.plan, n_boot=n_boot, seed=info.plan.seed,
                        order=list(info.topologies))
    write_summary(out_dir, summary)
    crossover.write(out_dir)
    return load_run(out_dir)
