"""The results folder: one sub-folder per sweep; list them, name new ones, export their tables."""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from crossover.capacity.output import RESULTS as CAPACITY_RESULTS
from crossover.loadgen.analysis.results import LIST_COLUMNS, RUN_FILE, SUMMARY_FILE, RunInfo, level_done

FORMATS = ("csv", "parquet", "json")
MIME = {"csv": "text/csv", "parquet": "application/vnd.apache.parquet", "json": "application/json"}


@dataclass(frozen=True)
class PastRun:
    path: Path
    name: str
    modified: float  # unix time of its run.json

    @property
    def label(self) -> str:
        return f"{self.name}  ({time.strftime('%Y-%m-%d %H:%M', time.localtime(self.modified))})"


def list_runs(results_dir: Path) -> list[PastRun]:
    """Sweep folders directly under results_dir (those with a run.json), `crossover capacity --out`
    folders (a capacity.json), and folders of `vllm bench serve` result files (JSON files and no
    run.json), newest first."""
    if not results_dir.is_dir():
        return []
    found = []
    for child in results_dir.iterdir():
        if not child.is_dir():
            continue
        marker = child / RUN_FILE
        plan = child / CAPACITY_RESULTS
        if marker.is_file():
            found.append(PastRun(child, child.name, marker.stat().st_mtime))
        elif plan.is_file():
            found.append(PastRun(child, f"{child.name} (capacity plan)", plan.stat().st_mtime))
        elif (changed := _bench_change(child)) is not None:
            found.append(PastRun(child, f"{child.name} (vllm bench results)", changed))
    return sorted(found, key=lambda run: (-run.modified, run.name))


def _bench_change(folder: Path) -> float | None:
    """For a folder of result files the app imports (crossover analyze's reading) rather than a
    sweep, when its newest JSON file changed (one walk); None for a sweep folder or one without
    JSON files."""
    if (folder / RUN_FILE).exists() or (folder / CAPACITY_RESULTS).exists():
        return None
    return max((path.stat().st_mtime for path in folder.rglob("*.json")), default=None)


class FolderChange(NamedTuple):
    modified: float  # unix time
    bench: bool  # a folder of vllm bench result files, not a sweep
    capacity: bool = False  # a `crossover capacity --out` folder, not a sweep


def last_change(run_dir: Path) -> FolderChange:
    """When a run folder last changed: its plan, or the summary loadgen rewrites after every level
    (for a folder of vllm bench result files, its newest file). Walks the folder at most once."""
    bench = _bench_change(run_dir)
    if bench is not None:
        return FolderChange(bench, bench=True)
    plan = run_dir / CAPACITY_RESULTS
    if plan.is_file() and not (run_dir / RUN_FILE).exists():
        return FolderChange(plan.stat().st_mtime, bench=False, capacity=True)
    files = [run_dir / name for name in (RUN_FILE, SUMMARY_FILE)]
    times = [path.stat().st_mtime for path in files if path.exists()]
    if not times:
        raise FileNotFoundError(f"{run_dir}: no {RUN_FILE}")
    return FolderChange(max(times), bench=False)


def being_written(run_dir: Path) -> bool:
    """Whether a sweep folder another process writes may still grow: no plan yet, or a planned level
    without its file. A folder that cannot be read is not waited for (opening it says why)."""
    try:
        info = RunInfo.from_json(json.loads((run_dir / RUN_FILE).read_text()))
    except FileNotFoundError:
        return True
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return not all(level_done(run_dir, info.plan, name, level)
                   for level in info.plan.levels for name in info.topologies)


def new_run_dir(results_dir: Path, now: float | None = None) -> Path:
    """A fresh, not yet existing folder named after the time: sweep-20260102-131415[-2]."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(time.time() if now is None else now))
    candidate = results_dir / f"sweep-{stamp}"
    suffix = 2
    while candidate.exists():
        candidate = results_dir / f"sweep-{stamp}-{suffix}"
        suffix += 1
    return candidate


def safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or "run"


def _flat(frame: pd.DataFrame) -> pd.DataFrame:
    """List-valued columns (per-token ITLs, chunk times) as JSON text, for CSV."""
    flat = frame.copy()
    for column in LIST_COLUMNS:
        if column in flat.columns:
            flat[column] = flat[column].map(lambda v: json.dumps([float(x) for x in v]))
    return flat


def table_bytes(frame: pd.DataFrame, fmt: str) -> bytes:
    """A table as CSV, Parquet or JSON (records) bytes, for a download button."""
    if fmt == "csv":
        return _flat(frame).to_csv(index=False).encode()
    if fmt == "parquet":
        buffer = io.BytesIO()
        plain = frame.copy()
        for column in LIST_COLUMNS:
            if column in plain.columns:
                plain[column] = plain[column].map(lambda v: [float(x) for x in v])
        plain.to_parquet(buffer, index=False)
        return buffer.getvalue()
    if fmt == "json":
        return frame.to_json(orient="records", indent=1, double_precision=15).encode()
    raise ValueError(f"unknown format {fmt!r} (have {FORMATS})")


def json_bytes(data: Any) -> bytes:
    return (json.dumps(data, indent=2, default=str) + "\n").encode()
