"""`crossover analyze DIR|FILES`: the crossover, capacities, table and sentences from result files
of `vllm bench serve --save-result --save-detailed` (one per topology and level), a sweep's own
`--save-result` files, GuideLLM benchmarks files, AIPerf artifact folders or inference-perf reports
(loadgen.analysis.imports; the topology from `--metadata topology=NAME`, --topology, or the files'
folders; docs/import.md).
With --out it also writes a run folder, which the app opens like any past sweep. Given sweep run
folders instead (`crossover sweep --shard M/K` on K machines), it merges them into the --out folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from crossover.errors import UserError
from crossover.loadgen.analysis import results
from crossover.loadgen.analysis.crossings import analyze
from crossover.loadgen.analysis.imports import Results, describe, read_results
from crossover.loadgen.analysis.results import Run, RunInfo
from crossover.loadgen.analysis.summary import summarize
from crossover.loadgen.plan import SweepPlan, TopologyInfo

# What --plot writes, by the file's suffix: a picture, or a page that needs no network to open.
PLOT_SUFFIXES = (".png", ".html")


def plot_suffix(path: str) -> str:
    """--plot FILE's suffix, checked before any work is done."""
    suffix = Path(path).suffix.lower()
    if suffix not in PLOT_SUFFIXES:
        raise UserError(f"--plot {path}: want a file ending in {' or '.join(PLOT_SUFFIXES)}, "
                        f"got {suffix or 'no suffix'}")
    return suffix


def write_plot(path: str, run: Run, out: Any) -> None:
    """The run's Pareto view into `path` (PNG or self-contained HTML), its sentences on `out`."""
    from crossover.app.charts import pareto_chart
    from crossover.loadgen.analysis.pareto import pareto_view

    view = pareto_view(run.summary, run.info.plan.axis, run.info.slos_ms, run.info.objective)
    if not view.points:
        raise UserError(f"--plot {path}: no level has both output tokens and a TPOT to draw")
    chart = pareto_chart(view).properties(width=640)
    try:
        if plot_suffix(path) == ".png":
            chart.save(path, format="png", scale_factor=2)
        else:
            chart.save(path, format="html", inline=True)  # the Vega scripts in the page: opens offline
    except OSError as exc:
        raise UserError(f"--plot {path}: cannot write it ({exc.strerror or exc})") from None
    for sentence in view.sentences:
        out.print(sentence)
    out.print(f"Pareto view in {path}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="DIR|FILE",
                        help="result files or folders: vllm bench serve, GuideLLM, AIPerf, inference-perf")
    parser.add_argument("--topology", action="append", default=[], metavar="NAME",
                        help="the topology of the given paths' results (once for all, or once per path; "
                             "else their folders name them)")
    parser.add_argument("--spec", default=None,
                        help="fleet spec: the topologies' GPUs, the SLOs and objective")
    parser.add_argument("--goodput", "--slo", nargs="+", action="extend", default=[], metavar="NAME:MS",
                        help="SLOs as vllm bench serve takes them, e.g. --goodput ttft:2500 tpot:50")
    parser.add_argument("--objective", type=float, default=None, help="share of good requests (0.99)")
    parser.add_argument("--gpus", action="append", default=[], metavar="TOPOLOGY=N",
                        help="GPUs of a topology (else --metadata gpus=N in the files, the spec, or 1)")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for intervals")
    parser.add_argument("--out", default=None, help="also write a run folder here (the app opens it)")
    parser.add_argument("--plot", default=None, metavar="FILE",
                        help="also draw the Pareto view (tokens/s per GPU against tokens/s per user) "
                             f"into FILE: {' or '.join(PLOT_SUFFIXES)} by its suffix")


def _gpus(results: Results, spec: Any, overrides: dict[str, int]) -> dict[str, int]:
    """GPUs per topology: --gpus, else the files' --metadata gpus=N, else the spec, else 1."""
    gpus: dict[str, int] = {}
    for topology in spec.topologies if spec is not None else []:
        if topology.gpus:  # a selector topology's GPUs are its pods, unknown here: metadata or --gpus
            gpus[topology.name] = topology.gpus
    for level in results.levels:
        if level.gpus is not None:
            try:
                gpus[level.topology] = int(level.gpus)
            except ValueError:
                raise UserError(f"{level.path}: metadata gpus={level.gpus!r} is not a whole number") from None
    gpus.update(overrides)
    return {level.topology: gpus.get(level.topology, 1) for level in results.levels}


def _merge_shards(folders: list[Path], args: argparse.Namespace) -> int:
    """Sweep folders of one plan's shards: one run folder of them all, its table and sentences."""
    from rich.console import Console

    from crossover.loadgen.analysis.results import merge_runs
    from crossover.loadgen.cli import print_summary

    if not args.out:
        raise UserError("--out: merging sweep folders writes one run folder; give --out DIR")
    merged = merge_runs(folders, Path(args.out), n_boot=args.bootstrap)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    print_summary(merged.summary, merged.crossover, out)
    if args.plot:
        write_plot(args.plot, merged, out)
    out.print(f"{len(folders)} shard folders merged into {merged.out_dir} (crossover app SPEC opens it)")
    return 0


def parse_gpus(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        if not value.isdigit() or int(value) < 1:
            raise UserError(f"--gpus {item!r}: want TOPOLOGY=N with N a positive whole number")
        out[name] = int(value)
    return out


def import_bench_run(paths: list[str], slos_ms: dict[str, float], objective: float, *, spec: Any = None,
                     gpus: dict[str, int] | None = None, n_boot: int = 200,
                     topologies: list[str] | None = None, results: Results | None = None) -> Run:
    """A run from the tools' result files: requests, summary and crossover as a sweep's."""
    results = results or read_results(paths, topologies or [])
    requests: pd.DataFrame = results.requests
    per_topology = _gpus(results, spec, gpus or {})
    order = list(dict.fromkeys(sorted(level.topology for level in results.levels)))
    plan = SweepPlan(mode=results.mode, levels=tuple(sorted({level.level for level in results.levels})),
                     requests_per_level=max(len(level.requests) for level in results.levels) or 1,
                     slos_ms=slos_ms, objective=objective)
    summary = summarize(requests, slos_ms, per_topology, plan)
    crossover = analyze(summary, requests, mode=plan.mode, objective=objective, slos_ms=slos_ms, plan=plan,
                        n_boot=n_boot, seed=0, order=order)
    info = RunInfo(plan=plan, slos_ms=dict(slos_ms), objective=objective,
                   model=results.levels[0].model,
                   topologies={name: TopologyInfo(name, per_topology[name], (), "imported")
                               for name in order})
    return Run(Path(paths[0]), info, requests, summary, crossover)


def write_run(folder: Path, run: Run) -> None:
    """An imported run as a run folder (run.json, levels, summary, crossover)."""
    results.prepare(folder, run.info)
    for (topology, level), frame in run.requests.groupby(["topology", "level"], sort=True):
        results.write_level(folder, run.info.plan, str(topology), float(level),  # type: ignore[arg-type]
                            frame.reset_index(drop=True))
    results.write_summary(folder, run.summary)
    run.crossover.write(folder)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from crossover.loadgen.cli import print_summary
    from crossover.loadgen.plan import parse_slo_overrides
    from crossover.spec import load_spec

    if args.bootstrap < 0:
        raise UserError(f"--bootstrap: must be zero or positive, got {args.bootstrap}")
    if args.plot:
        plot_suffix(args.plot)
    folders = [Path(p) for p in args.paths]
    if all((f / results.RUN_FILE).exists() for f in folders):
        return _merge_shards(folders, args)
    spec = load_spec(args.spec) if args.spec else None
    slos_ms = parse_slo_overrides(args.goodput) or (spec.slos.thresholds_ms if spec is not None else {})
    if not slos_ms:
        raise UserError("give the SLOs with --goodput ttft:MS tpot:MS (or a --spec with slos)")
    objective = args.objective if args.objective is not None else (spec.slos.objective if spec else 0.99)
    if not 0 < objective < 1:
        raise UserError(f"--objective: must be between 0 and 1, got {objective}")
    found = read_results(args.paths, args.topology)
    for warning in found.warnings:  # the tools' aggregates against their own requests, cut files
        print(f"warning: {warning}", file=sys.stderr)
    imported = import_bench_run(args.paths, slos_ms, objective, spec=spec, gpus=parse_gpus(args.gpus),
                                n_boot=args.bootstrap, results=found)
    out = Console() if sys.stdout.isatty() else Console(width=160)
    for line in describe(found):
        out.print(line, highlight=False)
    print_summary(imported.summary, imported.crossover, out)
    if args.out:
        write_run(Path(args.out), imported)
        out.print(f"run folder in {args.out} (crossover app SPEC opens it)")
    if args.plot:
        write_plot(args.plot, imported, out)
    return 0
