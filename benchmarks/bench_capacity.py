"""How fast `crossover capacity` searches: layouts' capacities per wall second, on every core.

    python benchmarks/bench_capacity.py [--workers N] [--smoke]

Two cases, each the whole search as the command runs it (capacities with their bands, the figures
at the user's load, the crossover map), timed from the parsed arguments to the ranked plan:

- many: Llama-3.1-8B on 10 L40S (compose/specs/pd-8k-prompts.yaml), every layout (35: TP 1/2/4/8
  colocated and every xPyD mix), open loop at 2 req/s, 512/128 tokens;
- 70b: Llama-3.1-70B on 8 H100 (compose/specs/seed-70b-h100.yaml), every layout (9), open loop
  at 4 req/s, 512/256 tokens.

Goals (docs/performance.md): many: at least 30 layouts in under 120 s on 2 cores; 70b: under 30 s.
The machine's load average is printed beside the figures, and the CPU seconds the workers spent, so
that a run on a shared machine reads as a ratio (CPU s / wall s: the cores the search kept busy).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from figures import add_smoke_flag, print_figures

from crossover.capacity import cli
from crossover.examples import __file__ as _examples

SPECS = Path(_examples).parent
CASES: dict[str, tuple[str, list[str], float]] = {
    # name: (spec, arguments, goal in wall seconds)
    "many": (
        "pd-8k-prompts.yaml",
        ["--gpus", "10", "--rate", "2", "--input-len", "512", "--output-len", "128"],
        120.0,
    ),
    "70b": (
        "seed-70b-h100.yaml",
        ["--gpus", "8", "--rate", "4", "--input-len", "512", "--output-len", "256"],
        30.0,
    ),
}
# The same two cases at tiny sizes (fewer GPUs, few requests, short levels): the same keys.
TINY = ["--requests", "40", "--span", "5", "--input-len", "128", "--output-len", "16"]
SMOKE: dict[str, tuple[str, list[str], float]] = {
    "many": ("pd-8k-prompts.yaml", ["--gpus", "2", "--rate", "2", *TINY], 120.0),
    "70b": ("seed-70b-h100.yaml", ["--gpus", "4", "--rate", "4", *TINY], 120.0),
}


def _cpu_s() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_case(spec: str, argv: list[str], workers: int | None) -> tuple[dict[str, Any], str]:
    """The case's figures (numbers only) and its verdict sentence."""
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    extra = ["--workers", str(workers)] if workers else []
    args = parser.parse_args([str(SPECS / spec), *argv, *extra])
    cpu, wall = _cpu_s(), time.perf_counter()
    plan, _ = cli.plan(args)
    wall = time.perf_counter() - wall
    cpu = _cpu_s() - cpu
    return {
        "layouts": len(plan.results),
        "wall_s": wall,
        "cpu_s": cpu,
        "busy_cores": cpu / wall,
        "layouts_per_min": len(plan.results) / wall * 60,
        "cpu_s_per_layout": cpu / len(plan.results),
    }, plan.verdict.sentence


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    add_smoke_flag(parser)
    args = parser.parse_args()
    cases = SMOKE if args.smoke else CASES
    load = os.getloadavg()[0]
    figures: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "load_before": load}
    print(f"cores {figures['cores']}, load average {load:.2f} before the run")
    for name, (spec, argv, goal) in cases.items():
        found, verdict = run_case(spec, argv, args.workers)
        found["met"] = int(found["wall_s"] < goal)
        figures[name] = found
        print(
            f"{name}: {found['layouts']} layouts in {found['wall_s']:.1f} s wall, {found['cpu_s']:.1f} CPU s "
            f"({found['busy_cores']:.2f} cores busy), goal < {goal:.0f} s: "
            f"{'met' if found['met'] else 'missed'}; {verdict}"
        )
    figures["load_after"] = os.getloadavg()[0]
    print_figures(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
