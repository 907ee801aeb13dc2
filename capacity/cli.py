"""`crossover capacity SPEC --gpus N`: every layout the budget admits, ranked by goodput per GPU on
the simulator's ground truth, with bands, a verdict, the crossover map and the top layouts' specs."""

from __future__ import annotations

import argparse
import math
import sys
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

from crossover.capacity import output, profiles, search, workload_file
from crossover.capacity.evaluate import DEFAULT_REQUESTS, DEFAULT_SPAN_S, Workload
from crossover.capacity.layouts import Layout, Space, enumerate_layouts, fit, layout_of
from crossover.errors import UserError
from crossover.loadgen.plan import Endpoint, Mode, SweepPlan
from crossover.spec import FleetSpec, load_spec

THINK_TIME_S = SweepPlan.think_time_s  # the sweep's default (--think-time)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="fleet spec: the model, the hardware, the SLOs")
    parser.add_argument("--gpus", type=int, help="the GPU budget (default: the spec's first topology's)")
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument(
        "--rate",
        help="open loop: requests/s (conversations/s with a multi-turn --workload), or a range LOW-HIGH "
        "for the crossover map",
    )
    load.add_argument("--concurrency", help="closed loop: requests in flight, or a range LOW-HIGH")
    parser.add_argument("--input-len", type=int, default=512, help="prompt tokens (512)")
    parser.add_argument("--output-len", type=int, default=256, help="output tokens (256)")
    parser.add_argument(
        "--workload",
        type=Path,
        metavar="FILE",
        help="prompt and output lengths from a sweep dataset (JSONL or ShareGPT) instead of "
        "--input-len; entries without an answer's length get --output-len; a ShareGPT file with "
        "--endpoint chat sends every turn of its conversations",
    )
    parser.add_argument(
        "--turns",
        type=int,
        metavar="N",
        help="a --workload conversation's first N turns at most (the sweep's --turns; default: all)",
    )
    parser.add_argument(
        "--think-time",
        type=float,
        default=THINK_TIME_S,
        metavar="S",
        help="seconds between a turn's answer and the conversation's next turn "
        f"({THINK_TIME_S:g}, the sweep's default)",
    )
    parser.add_argument(
        "--dataset-name",
        choices=("jsonl", "sharegpt"),
        help="the --workload file's format (default: .jsonl is JSONL, .json ShareGPT)",
    )
    parser.add_argument(
        "--endpoint",
        choices=("completions", "chat"),
        default="completions",
        help="count --workload prompts as /v1/completions text or chat messages (completions)",
    )
    parser.add_argument(
        "--tokenizer",
        metavar="DIR",
        help="count --workload tokens with this tokenizer folder (default: the simulator's)",
    )
    parser.add_argument(
        "--requests",
        type=int,
        default=DEFAULT_REQUESTS,
        help=f"requests counted per measured level ({DEFAULT_REQUESTS})",
    )
    for kind in ("ttft", "tpot", "itl", "e2el"):
        parser.add_argument(
            f"--{kind}-ms", type=float, help=f"{kind.upper()} SLO in ms (default: the spec's)"
        )
    parser.add_argument("--objective", type=float, help="SLO objective (default: the spec's)")
    parser.add_argument(
        "--profile",
        action="append",
        default=None,
        help=f"hardware profile: {', '.join(profiles.shipped())}, {profiles.SPEC_PROFILE} "
        "(the spec's own; default) or a profile YAML file; repeat to compare",
    )
    parser.add_argument("--step-error", type=float, help="the spec profile's step-time error (a share)")
    parser.add_argument(
        "--price",
        action="append",
        default=[],
        metavar="GPU=USD_PER_HOUR",
        help="a GPU's price per hour (its hardware.gpu label): rank per dollar too",
    )
    parser.add_argument("--tp", help="only these TP sizes, e.g. 2,4")
    parser.add_argument(
        "--layouts",
        choices=("all", "colocated", "pd", "spec"),
        default="all",
        help="all (default), only colocated, only P/D, or the spec's own topologies",
    )
    parser.add_argument("--workers", type=int, help="worker processes (default: one per core)")
    parser.add_argument("--out", type=Path, help="write capacity.json, plot.html and the top layouts' specs")
    parser.add_argument("--top", type=int, default=3, help="layouts written as specs and validated (3)")
    parser.add_argument(
        "--validate",
        action="store_true",
        help="run the top layouts on the live simulator with the real sweep",
    )
    parser.add_argument(
        "--span",
        type=float,
        default=DEFAULT_SPAN_S,
        help=f"open loop: seconds of arrivals a level spans at least ({DEFAULT_SPAN_S:g})",
    )
    parser.add_argument("--seed", type=int, default=0, help="the arrival draws' seed (0)")


def parse_loads(text: str, flag: str, mode: Mode) -> tuple[float, ...]:
    """One load, or LOW-HIGH: six levels between (doublings for concurrency)."""
    try:
        parts = [float(p) for p in text.split("-")] if "-" in text.strip("-") else [float(text)]
    except ValueError:
        raise UserError(f"{flag}: want a number or LOW-HIGH, got {text!r}") from None
    if any(p <= 0 for p in parts) or len(parts) > 2 or (len(parts) == 2 and parts[0] >= parts[1]):
        raise UserError(f"{flag}: want a positive number or LOW-HIGH with LOW < HIGH, got {text!r}")
    if mode is Mode.CLOSED and any(p != int(p) for p in parts):
        raise UserError(f"{flag}: a concurrency is a whole number, got {text!r}")
    if len(parts) == 1:
        return (parts[0],)
    low, high = parts
    if mode is Mode.CLOSED:
        levels, c = [], low
        while c < high:
            levels.append(c)
            c *= 2
        return (*levels, high)
    return tuple(float(f"{low + (high - low) * k / 5:.3g}") for k in range(6))


def parse_prices(items: list[str]) -> dict[str, float]:
    prices = {}
    for item in items:
        gpu, _, value = item.partition("=")
        try:
            price = float(value)
        except ValueError:
            price = -1.0
        if not gpu or price <= 0:
            raise UserError(f"--price: want GPU=USD_PER_HOUR (e.g. H100-SXM-80GB=2.5), got {item!r}")
        prices[gpu] = price
    return prices


def slos_of(spec: FleetSpec, args: argparse.Namespace) -> tuple[dict[str, float], float]:
    slos = dict(spec.slos.thresholds_ms)
    for kind in ("ttft", "tpot", "itl", "e2el"):
        value = getattr(args, f"{kind}_ms")
        if value is not None:
            if value <= 0:
                raise UserError(f"--{kind}-ms: must be positive, got {value:g}")
            slos[kind] = value
    objective = spec.slos.objective if args.objective is None else args.objective
    if not 0 < objective < 1:
        raise UserError(f"--objective: want a share between 0 and 1 (e.g. 0.99), got {objective:g}")
    return slos, objective


def layouts_for(spec: FleetSpec, args: argparse.Namespace, gpus: int) -> tuple[list[Layout], list]:
    if args.layouts == "spec":
        chosen = [layout_of(t) for t in spec.topologies if t.gpus == gpus]
        if not chosen:
            raise UserError(f"--gpus {gpus}: no topology of {args.spec} uses {gpus} GPUs")
        return chosen, [
            fit(spec, tp)
            for tp in sorted({lay.tp for lay in chosen} | {lay.decode_tp for lay in chosen if lay.decode_tp})
        ]
    try:
        tp = tuple(int(t) for t in args.tp.split(",")) if args.tp else None
    except ValueError:
        raise UserError(f"--tp: want TP sizes such as 2,4, got {args.tp!r}") from None
    space = Space(
        tp=tp, colocated=args.layouts in ("all", "colocated"), disaggregated=args.layouts in ("all", "pd")
    )
    return enumerate_layouts(spec, gpus, space)


def plan(args: argparse.Namespace) -> tuple[output.Plan, FleetSpec]:
    spec = load_spec(args.spec)
    mode = Mode.CLOSED if args.concurrency is not None else Mode.OPEN
    loads = parse_loads(
        args.concurrency or args.rate, "--concurrency" if mode is Mode.CLOSED else "--rate", mode
    )
    for flag, value in (
        ("--input-len", args.input_len),
        ("--output-len", args.output_len),
        ("--requests", args.requests),
        ("--top", args.top),
    ):
        if value < 1:
            raise UserError(f"{flag}: must be at least 1, got {value}")
    if args.workload is not None and not args.workload.is_file():
        raise UserError(f"--workload {args.workload}: no such file")
    if args.workload is None and args.input_len + args.output_len > spec.model.max_model_len:
        raise UserError(
            f"--input-len + --output-len: {args.input_len + args.output_len} tokens exceed "
            f"model.max_model_len {spec.model.max_model_len}"
        )
    slos, objective = slos_of(spec, args)
    prices = parse_prices(args.price)
    chosen = [
        profiles.of_spec(spec, args.step_error) if name == profiles.SPEC_PROFILE else profiles.load(name)
        for name in (args.profile or [profiles.SPEC_PROFILE])
    ]
    if len({p.name for p in chosen}) != len(chosen):
        raise UserError("--profile: each profile once, please")
    gpus = args.gpus if args.gpus is not None else spec.topologies[0].gpus
    if not args.span > 0:
        raise UserError(f"--span: must be a positive number of seconds, got {args.span:g}")
    if args.turns is not None and args.turns < 1:
        raise UserError(f"--turns: must be at least 1, got {args.turns}")
    if not (args.think_time >= 0 and math.isfinite(args.think_time)):
        raise UserError(f"--think-time: must be zero or positive seconds, got {args.think_time:g}")
    workload = Workload(mode, args.input_len, args.output_len, args.requests, args.seed, args.span,
                        think_time_s=args.think_time)
    if args.workload is not None:
        read = workload_file.read_conversations(
            args.workload,
            workload_file.dataset_kind(args.workload, args.dataset_name),
            Endpoint(args.endpoint),
            args.output_len,
            spec.model.max_model_len,
            args.tokenizer,
            spec.simulator.block_size,
            args.turns,
        )
        turns = [turn for talk in read.conversations for turn in talk]
        workload = replace(
            workload,
            input_len=max(1, round(sum(t.prompt_tokens for t in turns) / len(turns))),
            output_len=max(1, round(sum(t.output_tokens for t in turns) / len(turns))),
            conversations=read.conversations,
            turns=read.turns,
            source=str(args.workload),
            dataset=workload_file.dataset_kind(args.workload, args.dataset_name).value,
            endpoint=args.endpoint,
            tokenizer=args.tokenizer,
        )
    tasks, fits = [], []
    for profile in chosen:
        on_profile = profile.apply(spec)
        layouts, profile_fits = layouts_for(on_profile, args, gpus)
        fits += profile_fits
        tasks += [
            search.Task(
                on_profile, profile.name, profile.step_error, layout, workload, objective, slos, loads
            )
            for layout in layouts
        ]
    n = len(chosen)
    workers = search.workers(args.workers)
    with _progress(len(tasks)) as progress:
        job = progress.add_task("capacity", total=len(tasks)) if progress else None

        def advance() -> None:
            if progress is not None and job is not None:
                progress.advance(job)

        with (
            ProcessPoolExecutor(max_workers=min(workers, len(tasks)))
            if workers > 1 and len(tasks) > 1
            else nullcontext()
        ) as pool:
            results = search.run_all(tasks, search.run_task, pool, advance)
            map_loads = search.map_levels(results, mode, loads)
            if progress is not None and job is not None:
                progress.update(job, description="crossover map", total=2 * len(tasks), completed=len(tasks))
            along = search.run_all(
                [
                    search.Task(
                        t.spec,
                        t.profile,
                        t.step_error,
                        t.layout,
                        workload,
                        objective,
                        slos,
                        map_loads,
                        points_only=True,
                        ceiling=search.map_ceiling(r),
                    )
                    for t, r in zip(tasks, results, strict=True)
                ],
                search.run_points,
                pool,
                advance,
            )
    results = [
        search.LayoutResult(r.profile, r.layout, r.capacity, r.slow, r.fast, r.at_user, a)
        for r, a in zip(results, along, strict=True)
    ]
    price = None
    if prices:
        by_name = {p.name: p for p in chosen}

        def price(r: search.LayoutResult) -> float | None:
            value = prices.get(str(by_name[r.profile].hardware.get("gpu")))
            return None if value is None else value * r.gpus

    order = search.ranked(results, price)
    error = search.profile_error(chosen)
    found = output.Plan(
        args.spec,
        gpus,
        workload,
        objective,
        slos,
        loads,
        tuple(chosen),
        tuple(fits),
        tuple(order),
        search.verdict(order, n, price),
        map_loads,
        tuple(search.crossover_map(order, map_loads, n, error)),
        search.pareto(order, map_loads, n),
        prices,
    )
    return found, spec


def _progress(total: int):  # type: ignore[no-untyped-def]
    if not sys.stderr.isatty():
        return nullcontext(None)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def run(args: argparse.Namespace) -> int:
    found, spec = plan(args)
    for line in output.table(found):
        print(line)
    if args.out is not None:
        for path in output.write(found, spec, args.out, args.top):
            print(f"wrote {path}")
    if args.validate:
        from crossover.capacity import validate

        for line in validate.run_validation(found, spec, args.top):
            print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    from crossover.cli import main as crossover_main

    return crossover_main(["capacity", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    sys.exit(main())
