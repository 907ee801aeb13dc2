"""Result files of the benchmark tools users already run, read into the sweep's requests table so
`crossover analyze` finds the crossover in them (docs/import.md): vllm bench serve (benchjson),
GuideLLM (guidellm), AIPerf (aiperf) and inference-perf (inferenceperf).

`read_results` walks the given files and folders, asks each file which tool wrote it, and names
the topologies by one rule for every tool: `--metadata topology=` in a vllm bench file wins; else a
`--topology` flag; else, given one folder, the folder right under it that holds the file at any
depth (runs/tp4x1/c2/profile_export_aiperf.json: tp4x1), and given several paths, each path's own
name (a folder's, or a file's folder's).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from crossover.errors import UserError
from crossover.loadgen.analysis import benchjson
from crossover.loadgen.analysis.imports import aiperf, guidellm, inferenceperf
from crossover.loadgen.analysis.imports.common import (
    CLIENT_INPUT_TOKENS,
    CLIENT_OUTPUT_TOKENS,
    Measured,
    read_json,
    read_yaml,
)
from crossover.loadgen.plan import Mode

BENCH_TOOL = "vllm bench serve"
SUPPORTED = (f"{BENCH_TOOL} --save-result --save-detailed files, {guidellm.SUPPORTED}, {aiperf.SUPPORTED}, "
             f"{inferenceperf.SUPPORTED}")
RESULT_SUFFIXES = (".json", ".yaml", ".yml", ".jsonl")


@dataclass
class Level:
    """One topology at one load level, as some tool measured it."""

    path: Path
    tool: str  # "vllm bench serve", "guidellm 0.8.1", "aiperf 0.13.0", "inference-perf"
    topology: str
    mode: Mode
    level: float
    requests: pd.DataFrame = field(repr=False)
    model: str = ""
    gpus: str | None = None  # vllm bench's --metadata gpus=N, as written
    tokens: str = ""  # which token counts the figures use
    warnings: list[str] = field(default_factory=list)

    @property
    def tool_name(self) -> str:
        return self.tool.split(" ")[0] if not self.tool.startswith(BENCH_TOOL) else BENCH_TOOL


def _candidates(root: Path) -> list[Path]:
    if root.is_file():
        return [root]
    if root.is_dir():
        return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in RESULT_SUFFIXES
                      and not p.name.startswith("."))
    raise UserError(f"{root}: no such file or folder")


def _topology_of(path: Path, root: Path, several: bool) -> str:
    if several or root.is_file():
        return (root if root.is_dir() else root.parent).resolve().name
    relative = path.relative_to(root)
    return relative.parts[0] if len(relative.parts) > 1 else root.resolve().name


def _load(path: Path) -> Any:
    return read_yaml(path) if path.suffix in (".yaml", ".yml") else read_json(path)


def _measure(path: Path, explicit: bool) -> list[Measured | benchjson.BenchFile]:
    """What one file holds: levels of some tool, or nothing (another JSON file: a run folder's
    run.json, AIPerf's inputs.json...; given by name, that is an error)."""
    if path.suffix == ".jsonl":
        run = path.with_name(path.stem + aiperf.RUN_SUFFIX)
        if explicit and not run.exists():
            raise UserError(f"{path}: a JSONL file without an AIPerf {run.name} beside it; "
                            f"supported: {SUPPORTED}")
        return list(aiperf.read(run, read_json(run))) if explicit else []  # in a folder: with its run's JSON
    if inferenceperf.is_stage_report(path):
        return []  # read per folder (read_results)
    if path.name.endswith(inferenceperf.PER_REQUEST) or path.name.endswith("_lifecycle_metrics.json"):
        return []  # inference-perf's per-request, summary and adapter reports: read with the stages
    data = _load(path)
    if benchjson.is_bench_result(data):
        bench = benchjson.bench_file(path, data)
        return [bench]
    if guidellm.looks_like(data):
        return list(guidellm.read(path, data))
    if aiperf.looks_like(data):
        if path.name.endswith(aiperf.RUN_SUFFIX) or explicit:
            return list(aiperf.read(path, data))
        return []
    if explicit:
        looks = _looks_like(data)
        raise UserError(f"{path}: {looks}; supported: {SUPPORTED}")
    return []


def _looks_like(data: Any) -> str:
    """What an unknown file seems to be, for the one-line error."""
    if isinstance(data, dict):
        for key in ("genai_perf_version", "genai-perf"):
            if key in data:
                return "looks like GenAI-Perf's export (AIPerf's predecessor), not imported"
        if "completed" in data or "request_throughput" in data:
            return "looks like a vllm bench serve aggregate without the per-request fields"
    return "not a result file of any tool crossover imports"


@dataclass
class Results:
    levels: list[Level]

    @property
    def mode(self) -> Mode:
        return self.levels[0].mode

    @property
    def warnings(self) -> list[str]:
        return [w for level in self.levels for w in level.warnings]

    @property
    def requests(self) -> pd.DataFrame:
        return pd.concat([level.requests for level in self.levels], ignore_index=True)


def _frame(measured: Measured, topology: str) -> pd.DataFrame:
    frame = pd.DataFrame(measured.rows)
    if frame.empty:
        return frame
    frame["topology"] = topology
    frame["level"] = measured.level
    return frame


def read_results(paths: Sequence[str], topologies: Sequence[str] = ()) -> Results:
    """Every level of every tool's result files under the given files and folders, its topology
    named (see the module's docstring; `topologies`: the --topology flag, one name for all paths
    or one per path), checked: one load axis, one file per (topology, level), and when several
    tools are mixed, each tool measured the same topologies."""
    roots = [Path(p) for p in paths]
    if topologies and len(topologies) not in (1, len(roots)):
        raise UserError(f"--topology: give one name, or one per path ({len(roots)}), not {len(topologies)}")
    several = len(roots) > 1
    levels: list[Level] = []
    passed_over: list[Path] = []  # files no tool claimed, named when nothing was found
    for number, root in enumerate(roots):
        flag = topologies[0] if len(topologies) == 1 else topologies[number] if topologies else None
        stage_groups: dict[tuple[Path, str], list[Path]] = defaultdict(list)
        for path in _candidates(root):
            explicit = root.is_file()
            if inferenceperf.is_stage_report(path):
                match = inferenceperf.STAGE.match(path.name)
                assert match is not None
                stage_groups[(path.parent, match["prefix"])].append(path)
                continue
            measured = _measure(path, explicit)
            if not measured and path.suffix in (".json", ".yaml", ".yml"):
                passed_over.append(path)
            for found in measured:
                named = flag or _topology_of(path, root, several)
                if isinstance(found, benchjson.BenchFile):
                    topology = found.topology or named
                    levels.append(Level(path, BENCH_TOOL, topology, found.mode, found.level,
                                        benchjson.requests_frame(found, topology),
                                        model=str(found.data.get("model_id", "")),
                                        gpus=None if found.data.get("gpus") is None
                                        else str(found.data["gpus"]),
                                        tokens="the server's usage as vllm bench recorded it"))
                else:
                    levels.append(_level(found, named))
        for _, stage_paths in sorted(stage_groups.items()):
            named = flag or _topology_of(stage_paths[0], root, several)
            levels.extend(_level(found, named) for found in inferenceperf.read_folder(stage_paths))
    if not levels:
        seen = ""
        if passed_over:
            names = ", ".join(p.name for p in passed_over[:3]) + (", ..." if len(passed_over) > 3 else "")
            seen = f" (passed over {len(passed_over)} file(s) of no tool it imports: {names})"
        raise UserError(f"{', '.join(paths)}: no result files there{seen}; supported: {SUPPORTED}")
    _check(levels)
    return Results(levels)


def _level(measured: Measured, topology: str) -> Level:
    return Level(measured.path, measured.tool, topology, measured.mode, measured.level,
                 _frame(measured, topology), model=measured.model, tokens=measured.tokens,
                 warnings=list(measured.warnings))


def _check(levels: list[Level]) -> None:
    axes = {level.mode for level in levels}
    tools = sorted({level.tool_name for level in levels})
    if len(axes) > 1:
        by_axis = {mode.axis: sorted({lv.tool for lv in levels if lv.mode is mode}) for mode in axes}
        raise UserError("the results mix load axes (" + "; ".join(
            f"{axis}: {', '.join(names)}" for axis, names in sorted(by_axis.items()))
            + "); analyze one axis at a time (GuideLLM's sweep and throughput runs are on the rate axis)")
    if len(tools) > 1:
        covered = {tool: sorted({lv.topology for lv in levels if lv.tool_name == tool}) for tool in tools}
        if len({tuple(names) for names in covered.values()}) > 1:
            raise UserError("mixed tools measured different topologies (" + "; ".join(
                f"{tool}: {', '.join(names)}" for tool, names in covered.items()) + "); each tool's client "
                "adds its own latency, so compare topologies measured by the same tools")
    seen: dict[tuple[str, float], Path] = {}
    for level in levels:
        key = (level.topology, level.level)
        if key in seen:
            raise UserError(f"{level.path}: a second result for topology {level.topology} at "
                            f"{level.mode.axis} {level.level:g} (also {seen[key]})")
        seen[key] = level.path
        if level.requests.empty:
            raise UserError(f"{level.path}: no requests at {level.mode.axis} {level.level:g}")


def describe(results: Results) -> list[str]:
    """One line per tool: how many levels of which topologies, which token counts the figures use,
    and where the tool's own counts differ from them, both means per request."""
    lines = []
    for tool in dict.fromkeys(level.tool for level in results.levels):
        mine = [level for level in results.levels if level.tool == tool]
        topologies = ", ".join(sorted({level.topology for level in mine}))
        line = (f"{tool}: {len(mine)} level(s) of {topologies} on the {mine[0].mode.axis} axis; "
                f"tokens: {mine[0].tokens}")
        requests = pd.concat([level.requests for level in mine], ignore_index=True)
        if CLIENT_OUTPUT_TOKENS in requests and requests["ok"].any():
            ok = requests[requests["ok"].astype(bool)]
            figures = (ok["input_tokens"].mean(), ok["output_tokens"].mean())
            own = (ok[CLIENT_INPUT_TOKENS].mean(), ok[CLIENT_OUTPUT_TOKENS].mean())
            if any(not math.isclose(a, b, rel_tol=0.01) for a, b in zip(figures, own, strict=True)):
                line += (f" (per request the tool counted {own[0]:.3g} input and {own[1]:.3g} output tokens, "
                         f"the figures {figures[0]:.3g} and {figures[1]:.3g})")
        lines.append(line)
    by_topology = {t: {lv.level for lv in results.levels if lv.topology == t}
                   for t in {lv.topology for lv in results.levels}}
    if len(by_topology) > 1 and len(set.intersection(*by_topology.values())) < 2:
        # achieved rates (GuideLLM's sweep and throughput runs) differ between topologies: the
        # crossings read each curve between its own levels (crossings.Curves)
        lines.append("note: the topologies were measured at different levels, so the crossings compare them "
                     "at the union of their levels inside both ranges, each curve linear between its own "
                     "levels (same levels for every topology are exact: GuideLLM --profile kind=constant "
                     "with --override profile.rate R1,R2,...; or kind=concurrent)")
    return lines


