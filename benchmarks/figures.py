"""What every benchmark shares besides its own measurement: the `--smoke` flag and the one
machine-readable form of its figures, a last line `figures: {json}` after its human table.

docs/performance.md lists each benchmark's keys (dotted paths into that object, `*` for every
column); tests/test_benchmarks.py runs each `--smoke` and reads this line back with `parse`.
Scripts import it as a sibling module (`from figures import ...`): benchmarks/ is on sys.path when
a script in it runs.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PREFIX = "figures: "


def add_smoke_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--smoke", action="store_true",
                        help="a run of seconds at tiny sizes through the same code path as a full run "
                             "(CI runs it: tests/test_benchmarks.py); its figures say nothing about speed")


def skipped(what: str) -> None:
    """One line saying what this run left out, and why (a tool or device the machine lacks)."""
    print(f"skipped: {what}", flush=True)


def _finite(value: Any) -> Any:
    """NaN and infinities as null: a figure not measured is not a number."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def print_figures(figures: Mapping[str, Any]) -> None:
    """The benchmark's figures as one JSON line, the last thing it prints."""
    print(PREFIX + json.dumps(_finite(figures), default=str), flush=True)


def loadavg() -> str:
    """The machine's load average as /proc says it: runs on a shared machine print it beside
    their figures, so a reader can tell a slow run from a busy machine."""
    return Path("/proc/loadavg").read_text().strip()


def finish(figures: dict[str, Any], json_path: str | None) -> int:
    """A load-aware benchmark's ending: the load at its end beside the one at its start (the key
    `loadavg_start`), the figures written to `json_path` if given, and the `figures:` line."""
    figures["loadavg_end"] = loadavg()
    print(f"load average: start {figures['loadavg_start']}, end {figures['loadavg_end']}")
    if json_path:
        Path(json_path).write_text(json.dumps(figures, indent=2) + "\n")
    print_figures(figures)
    return 0


def parse(output: str) -> dict[str, Any] | None:
    """The figures a benchmark printed (its last `figures:` line), or None when it printed none."""
    lines = [line for line in output.splitlines() if line.startswith(PREFIX)]
    if not lines:
        return None
    found: dict[str, Any] = json.loads(lines[-1][len(PREFIX):])
    return found
