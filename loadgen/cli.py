"""`crossover sweep SPEC --concurrency 1,2,4,8 --out DIR`: drive traffic, print the tables and the
crossover. A rich progress display on a terminal, plain lines otherwise."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crossover import slo
from crossover.errors import UserError

if TYPE_CHECKING:
    from crossover.loadgen.analysis.report import CrossoverReport


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", help="fleet spec (YAML)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", "--max-concurrency",
                      help="closed loop: comma-separated concurrencies, e.g. 1,2,4,8,16")
    load.add_argument("--rate", help="open loop: comma-separated request rates (req/s), e.g. 0.5,1,2")
    parser.add_argument("--out", required=True, help="run folder; rerunning with the same folder resumes")
    parser.add_argument("--topology", action="append", default=None,
                        help="topology to drive (repeatable; default: all in the spec)")
    parser.add_argument("--requests", "--num-prompts", type=int, default=None, help="requests per level")
    parser.add_argument("--rounds", type=float, default=4.0,
                        help="closed loop without --requests/--duration: rounds x concurrency requests (4)")
    parser.add_argument("--duration", type=float, default=None, help="seconds per level")
    parser.add_argument("--input-len", default="128", help="N, uniform:LOW-HIGH, normal:MEAN,STD[,LOW-HIGH]")
    parser.add_argument("--output-len", default="64", help="same forms as --input-len")
    parser.add_argument("--no-ignore-eos", action="store_true", help="let the model stop early")
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds trimmed at each level's start")
    parser.add_argument("--cooldown", type=float, default=0.0, help="seconds trimmed at each level's end")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    parser.add_argument("--ramp", type=float, default=0.0, help="seconds of linear ramp per level")
    parser.add_argument("--arrival", choices=["poisson", "gamma"], default="poisson")
    parser.add_argument("--burstiness", type=float, default=1.0, help="gamma shape (1 = Poisson)")
    parser.add_argument("--slo", action="append", default=[], metavar="NAME:MS",
                        help="override a spec SLO, e.g. --slo ttft:2500 --slo tpot:50 (replaces all)")
    parser.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS",
                        help="as `vllm bench serve` spells --slo: --goodput ttft:2500 tpot:50")
    parser.add_argument("--objective", type=float, default=None, help="override spec slos.objective")
    parser.add_argument("--bootstrap", type=int, default=200, help="bootstrap resamples for intervals")
    parser.add_argument("--csv", action="store_true", help="also write each level's requests as CSV")
    parser.add_argument("--no-progress", action="store_true", help="plain lines instead of a live display")
    add_workload_arguments(parser)
    _add_search_and_scale_arguments(parser)


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """What the requests are: endpoint, dataset and tokenizer (the `vllm bench serve` names work too)."""
    group = parser.add_argument_group("workload")
    group.add_argument("--endpoint", choices=["completions", "chat"], default="completions",
                       help="/v1/completions (prompts as token ids) or /v1/chat/completions")
    group.add_argument("--tokenizer", default=None, metavar="DIR",
                       help="a local tokenizer folder (tokenizer.json) to count tokens; default: the "
                            "server's /tokenize and /detokenize")
    group.add_argument("--dataset-name", choices=["random", "jsonl", "sharegpt"], default=None,
                       help="random prompts (default), a JSONL file or a ShareGPT JSON file")
    group.add_argument("--dataset-path", default=None, metavar="FILE", help="the jsonl or sharegpt file")
    group.add_argument("--request-rate", default=None,
                       help="as in vllm bench: --rate, or inf with --max-concurrency (closed loop)")
    group.add_argument("--turns", type=int, default=1,
                       help="requests per conversation (chat): each turn sends the history and a new message")
    group.add_argument("--think-time", type=float, default=0.0,
                       help="seconds between a turn's answer and the next")
    group.add_argument("--random-input-len", type=int, default=None, help="as in vllm bench: --input-len N")
    group.add_argument("--random-output-len", type=int, default=None, help="as in vllm bench: --output-len N")
    group.add_argument("--random-range-ratio", type=float, default=0.0,
                       help="as in vllm bench: lengths uniform in N x [1 - R, 1 + R]")
    group.add_argument("--save-result", action="store_true",
                       help="also write each (topology, level) as a vllm bench serve result JSON")
    group.add_argument("--save-detailed", action="store_true",
                       help="with the per-request lists (as vllm bench)")
    group.add_argument("--percentile-metrics", default=None,
                       help="vllm bench's: ttft,tpot,itl (default),e2el")
    group.add_argument("--metric-percentiles", default=None, help="vllm bench's: e.g. 50,90,99 (default 99)")
    group.add_argument("--ignore-eos", action="store_true",
                       help="as in vllm bench (the default here; --no-ignore-eos turns it off)")


def _bench_options(args: argparse.Namespace) -> Any:
    """--save-result and its companions; None when no result JSON is asked for."""
    from crossover.loadgen.analysis.benchjson import BenchOptions

    options = BenchOptions.parse(args.percentile_metrics, args.metric_percentiles, args.save_detailed)
    return options if args.save_result or args.save_detailed else None


def _workload_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The plan's workload fields from the workload options (see add_workload_arguments)."""
    from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist

    if args.ignore_eos and args.no_ignore_eos:
        raise UserError("--ignore-eos and --no-ignore-eos: give one of them")
    if not 0 <= args.random_range_ratio < 1:
        raise UserError(f"--random-range-ratio: must be in [0, 1), got {args.random_range_ratio}")

    def length(option: str, given: int | None, fallback: str) -> LengthDist:
        if given is None:
            return LengthDist.parse(fallback, option.replace("random-", ""))
        if given < 1:
            raise UserError(f"{option}: length must be at least 1, got {given}")
        low = max(1, int(given * (1 - args.random_range_ratio)))
        high = max(low, int(given * (1 + args.random_range_ratio)))
        return LengthDist.fixed(given) if low == high else LengthDist.parse(f"uniform:{low}-{high}", option)

    name = args.dataset_name or ("jsonl" if args.dataset_path and args.dataset_path.endswith(".jsonl")
                                 else "sharegpt" if args.dataset_path else "random")
    if name == "random" and args.dataset_path:
        raise UserError(f"--dataset-path {args.dataset_path}: random prompts take no file "
                        "(give --dataset-name jsonl or sharegpt)")
    if name != "random" and not args.dataset_path:
        raise UserError(f"--dataset-name {name}: give the file with --dataset-path")
    return {"endpoint": Endpoint(args.endpoint), "dataset": DatasetKind(name),
            "dataset_path": args.dataset_path, "tokenizer": args.tokenizer, "turns": args.turns,
            "think_time_s": args.think_time,
            "input_len": length("--random-input-len", args.random_input_len, args.input_len),
            "output_len": length("--random-output-len", args.random_output_len, args.output_len)}


def _add_search_and_scale_arguments(parser: argparse.ArgumentParser) -> None:
    """Adaptive levels and load generation across processes and machines (docs/sweep.md)."""
    group = parser.add_argument_group("adaptive levels and load generation across cores")
    group.add_argument("--adaptive", action="store_true",
                       help="the levels given are the range and coarse start; add levels where the widest "
                            "interval (crossing of --metric, capacity at the objective) needs them")
    group.add_argument("--target-ci", type=float, default=None, metavar="WIDTH",
                       help="adaptive: stop when every interval is narrower than WIDTH x its estimate (0.1)")
    group.add_argument("--metric", default=None,
                       help=f"adaptive: the metric whose crossing is sought ({slo.GOODPUT_REQUESTS})")
    group.add_argument("--narrow", default=None, metavar="ANSWERS",
                       help="adaptive: the intervals to narrow, crossing and/or capacity (crossing,capacity)")
    group.add_argument("--max-requests", type=int, default=None,
                       help="adaptive: budget of requests over all topologies and levels")
    group.add_argument("--max-duration", type=float, default=None, metavar="SECONDS",
                       help="adaptive: budget of traffic seconds over all topologies and levels")
    group.add_argument("--max-repeats", type=int, default=None, metavar="N",
                       help="adaptive: measure each end level of an answer's bracket up to N times, with "
                            "fresh seeds: N that agree on its side confirm it, two that disagree "
                            "put it in the answer's band (2; 1: never again)")
    group.add_argument("--workers", type=int, default=1,
                       help="processes sending each level's traffic (at most the cores; 1)")
    group.add_argument("--shard", default=None, metavar="M/K",
                       help="this machine is shard M of K, each running --workers processes of the same "
                            "plan; merge the K folders with `crossover analyze`")


def _adaptive(args: argparse.Namespace) -> Any:
    """The adaptive plan, or None; the adaptive-only flags without --adaptive are a mistake."""
    from crossover.loadgen.analysis.adaptive import (
        ANSWERS,
        DEFAULT_MAX_REPEATS,
        DEFAULT_METRIC,
        DEFAULT_TARGET_CI,
        AdaptivePlan,
    )
    from crossover.loadgen.analysis.report import RENAMED

    if args.metric in RENAMED:
        print(f"crossover sweep: --metric {args.metric} is deprecated and goes in the next release; "
              f"use --metric {RENAMED[args.metric]}", file=sys.stderr)

    given = [flag for flag, value in (("--target-ci", args.target_ci), ("--metric", args.metric),
                                      ("--narrow", args.narrow),
                                      ("--max-requests", args.max_requests),
                                      ("--max-duration", args.max_duration),
                                      ("--max-repeats", args.max_repeats)) if value is not None]
    if not args.adaptive:
        if given:
            raise UserError(f"{given[0]}: only for an adaptive sweep (add --adaptive)")
        return None
    return AdaptivePlan(target_ci=DEFAULT_TARGET_CI if args.target_ci is None else args.target_ci,
                        metric=args.metric or DEFAULT_METRIC, max_requests=args.max_requests,
                        max_duration_s=args.max_duration,
                        max_repeats=DEFAULT_MAX_REPEATS if args.max_repeats is None else args.max_repeats,
                        answers=tuple(a.strip() for a in args.narrow.split(",")) if args.narrow else ANSWERS)


def _traffic(args: argparse.Namespace) -> Any:
    from crossover.loadgen.sweep import Traffic
    from crossover.loadgen.traffic.workers import parse_shard

    return Traffic(workers=args.workers, shard=parse_shard(args.shard))


def _request_rate(args: argparse.Namespace) -> str:
    """The open-loop rates from --rate or vllm bench's --request-rate (whose `inf` with
    --max-concurrency is our closed loop); one of the two loads must be given."""
    rate = args.rate
    asked = args.request_rate
    if asked is not None:
        if args.rate is not None:
            raise UserError("--rate and --request-rate: give one of them")
        if asked.strip().lower() == "inf":
            if not args.concurrency:
                raise UserError("--request-rate inf: give --max-concurrency (a closed loop at each "
                                "concurrency)")
        elif args.concurrency:
            raise UserError("--request-rate with --max-concurrency: a rate capped by a concurrency is not "
                            "supported; give one of them (or --request-rate inf)")
        else:
            rate = asked
    if not args.concurrency and not rate:
        raise UserError("give --concurrency (closed loop) or --rate (open loop)")
    return str(rate or "")


def _plan(args: argparse.Namespace) -> Any:
    from crossover.loadgen.plan import (
        Arrival,
        Mode,
        SweepPlan,
        parse_levels,
        parse_slo_overrides,
    )

    rate = _request_rate(args)
    mode = Mode.CLOSED if args.concurrency else Mode.OPEN
    levels = parse_levels(args.concurrency or rate, "--concurrency" if args.concurrency else "--rate")
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap: must be zero or positive, got {args.bootstrap}")
    return SweepPlan(
        mode=mode, levels=levels, requests_per_level=args.requests, rounds=args.rounds,
        duration_s=args.duration, ignore_eos=not args.no_ignore_eos,
        shared_prefix=args.shared_prefix, seed=args.seed, warmup_s=args.warmup, cooldown_s=args.cooldown,
        timeout_s=args.timeout, ramp_s=args.ramp, arrival=Arrival(args.arrival), burstiness=args.burstiness,
        slos_ms=parse_slo_overrides(args.slo + args.goodput) or None, objective=args.objective,
        **_workload_fields(args))


def _latency_column(kind: str, q: float, form: str) -> tuple[str, str, str]:
    """(summary column, header, format) of one latency quantile: ("ttft", 0.99) -> "TTFT p99 ms"."""
    return slo.percentile_column(kind, q), f"{kind.upper()} {slo.percentile_label(q)} ms", form


_TABLE_COLUMNS = (("topology", "topology", "{}"), ("level", "level", "{:g}"), ("requests", "n", "{:.0f}"),
                  ("failed", "failed", "{:.0f}"), ("output_tps", "out tok/s", "{:.1f}"),
                  ("output_tps_per_gpu", "/GPU", "{:.1f}"), (slo.GOODPUT_REQUESTS, "goodput r/s", "{:.2f}"),
                  (slo.attainment_column(), "attain", "{:.0%}"),
                  _latency_column("ttft", slo.TAIL_QUANTILE, "{:.0f}"),
                  _latency_column("tpot", slo.TAIL_QUANTILE, "{:.1f}"),
                  _latency_column("itl", slo.TAIL_QUANTILE, "{:.1f}"))


def _cell(value: Any, form: str) -> str:
    try:
        return form.format(value)
    except (ValueError, TypeError):
        return str(value)


def print_summary(summary: Any, crossover: CrossoverReport, console: Any) -> None:
    from rich.table import Table

    table = Table(title="sweep summary (steady-state window)")
    for _, header, _ in _TABLE_COLUMNS:
        table.add_column(header, justify="left" if header == "topology" else "right")
    for _, row in summary.iterrows():
        table.add_row(*(_cell(row.get(column), form) for column, _, form in _TABLE_COLUMNS))
    console.print(table)
    from crossover.loadgen.analysis.summary import level_warnings

    for sentence in crossover.sentences:
        console.print(f"- {sentence}")
    for warning in level_warnings(summary):
        console.print(f"warning: {warning}")


def print_turns(turns: Any, console: Any) -> None:
    from rich.table import Table

    table = Table(title="per turn (a later turn's prompt holds the conversation so far)")
    columns = (("topology", "topology", "{}"), ("level", "level", "{:g}"), ("turn", "turn", "{:.0f}"),
               ("requests", "n", "{:.0f}"), ("input_tokens", "input tok", "{:.0f}"),
               _latency_column("ttft", 0.5, "{:.0f}"), _latency_column("ttft", slo.TAIL_QUANTILE, "{:.0f}"),
               _latency_column("itl", slo.TAIL_QUANTILE, "{:.1f}"))
    for _, header, _ in columns:
        table.add_column(header, justify="left" if header == "topology" else "right")
    for _, row in turns.iterrows():
        table.add_row(*(_cell(row.get(column), form) for column, _, form in columns))
    console.print(table)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from crossover.loadgen.analysis.summary import level_warnings
    from crossover.loadgen.sweep import LevelDone, run_sweep
    from crossover.spec import load_spec

    spec = load_spec(args.spec)
    plan = _plan(args)
    adaptive = _adaptive(args)
    traffic = _traffic(args)
    _bench_options(args)  # a bad --percentile-metrics is an error before any traffic
    for name in args.topology or []:
        spec.topology(name)
    console = Console(stderr=True)
    live = console.is_terminal and not args.no_progress
    stop = threading.Event()
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, disable=not live)
    n_topologies = len(args.topology or spec.topologies)
    overall = progress.add_task("levels", total=None if adaptive else len(plan.levels) * n_topologies)
    current = progress.add_task("requests", total=None)

    def on_request(topology: str, level: float, done: int, total: int | None) -> None:
        progress.update(current, description=f"{topology} @ {plan.axis} {level:g}", completed=done,
                        total=total)

    def on_level(event: LevelDone) -> None:
        progress.update(overall, completed=event.position, total=event.total)
        row = event.summary[(event.summary["topology"] == event.topology)
                            & (event.summary["level"] == event.level)]
        if row.empty:
            return
        first = row.iloc[0]
        line = (f"{event.topology} {plan.axis} {event.level:g}: {first['requests']:.0f} requests, "
                f"{first['failed']:.0f} failed, {first['output_tps']:.1f} output tok/s, goodput "
                f"{first[slo.GOODPUT_REQUESTS]:.2f} req/s, attainment {first['attainment']:.0%}, input "
                f"{first.get('input_tokens_counted', float('nan')):.0f} tokens"
                + (" (resumed)" if event.resumed else ""))
        lines = [line] + [f"warning: {w}" for w in level_warnings(row)]
        for text in lines:
            if live:
                progress.console.print(text)
            else:
                print(text, file=sys.stderr, flush=True)

    with progress:
        try:
            result = run_sweep(spec, plan, Path(args.out), args.topology, on_level=on_level, stop=stop,
                               on_request=on_request if live else None, csv=args.csv, n_boot=args.bootstrap,
                               bench=_bench_options(args), adaptive=adaptive, traffic=traffic)
        except KeyboardInterrupt:
            stop.set()
            raise
    out = Console() if sys.stdout.isatty() else Console(width=160)  # files and pipes: no 80-column squeeze
    if not result.summary.empty:
        print_summary(result.summary, result.crossover, out)
    if adaptive is not None:
        from crossover.loadgen.analysis.adaptive import adaptive_line

        out.print(adaptive_line(result.crossover.adaptive, plan.axis))
    if not result.turns.empty:
        print_turns(result.turns, out)
    workload = result.workload
    out.print(f"prompt tokens counted with {workload['tokenizer']}"
              + (f"; the chat template adds {workload['chat_template_tokens']} tokens per request"
                 if workload["endpoint"] == "chat" else ""))
    out.print(f"results in {result.out_dir} (requests per level under levels/, summary.csv, crossover.json)")
    failed = int(result.summary["failed"].sum()) if "failed" in result.summary else 0
    if failed:
        console.print(f"note: {failed} request(s) failed; they count against goodput")
    return 0
