"""GuideLLM's benchmarks file (`guidellm run --output kind=json|yaml,path=...`; 0.7.x and 0.8.x,
both report schema version 2), one level per benchmark in it.

Field names from GuideLLM 0.8.1 and 0.7.1 as installed (guidellm/schemas/benchmark/generative.py:
GenerativeBenchmarksReport {metadata {version, guidellm_version}, config, benchmarks}; each
benchmark {config.strategy {type_, streams, rate}, metrics, requests {successful, errored,
incomplete}, duration}; a request's GenerativeRequestStats {request_start_time, request_end_time,
request_latency, time_to_first_token_ms, inter_token_latency_ms, prompt_tokens, output_tokens,
input_metrics.text_tokens, output_metrics.text_tokens, info.error}).

The load level: a `sweep` profile (synchronous, throughput and constant-rate runs in one file) and
throughput runs go on the rate axis at each run's achieved request rate (its requests over its
duration, as GuideLLM's own requests_per_second); concurrent runs at their streams, synchronous
ones at concurrency 1, constant/poisson/async ones at their configured rate.
Tokens: GuideLLM prefers the server's usage (`prefer_response_metrics`, on by default) for
prompt_tokens and output_tokens, which the figures use; its text-side counts are kept as the
client's. It keeps no per-token times: a request's ITLs are its mean inter-token latency, once
per token after the first (ITL percentiles are then of per-request means).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossover.errors import UserError
from crossover.loadgen.analysis.imports.common import (
    Measured,
    check_aggregate,
    mean,
    request_row,
    version_prefix,
)
from crossover.loadgen.plan import Mode

TOOL = "guidellm"
SCHEMA_VERSIONS = (2,)
VERSIONS = ("0.7", "0.8")
SUPPORTED = f"GuideLLM {' and '.join(v + '.x' for v in VERSIONS)} (report schema version 2)"
CLOSED_STRATEGIES = {"concurrent", "synchronous"}
RATE_STRATEGIES = {"constant", "poisson", "async"}


def looks_like(data: Any) -> bool:
    """A GuideLLM report of any version: its metadata names GuideLLM, or (before 0.7) its
    benchmarks are GuideLLM's generative_benchmark objects."""
    if not isinstance(data, dict) or not isinstance(data.get("benchmarks"), list):
        return False
    metadata = data.get("metadata")
    return (isinstance(metadata, dict) and "guidellm_version" in metadata) or any(
        isinstance(b, dict) and b.get("type_") == "generative_benchmark" for b in data["benchmarks"])


def version_of(data: dict[str, Any]) -> str:
    return str((data.get("metadata") or {}).get("guidellm_version") or "unknown")


def check_version(path: Path, data: dict[str, Any]) -> None:
    metadata = data.get("metadata")
    if not isinstance(metadata, dict):  # GuideLLM wrote report metadata from 0.7 on
        raise UserError(f"{path}: looks like a GuideLLM benchmarks file from before 0.7 (no report "
                        f"metadata); supported: {SUPPORTED}")
    version = version_of(data)
    schema = metadata.get("version")
    if schema not in SCHEMA_VERSIONS or version_prefix(version) not in VERSIONS:
        raise UserError(f"{path}: looks like a GuideLLM {version} benchmarks file (report schema "
                        f"{schema}); supported: {SUPPORTED}")


def read(path: Path, data: dict[str, Any]) -> list[Measured]:
    check_version(path, data)
    version = version_of(data)
    spec = (data.get("config") or {}).get("spec") or {}
    sweep = (spec.get("profile") or {}).get("kind") == "sweep"
    model = str((spec.get("backend") or {}).get("model") or "")
    levels = []
    for number, benchmark in enumerate(data["benchmarks"]):
        where = f"{path} (benchmark {number})"
        try:
            levels.append(_benchmark(path, where, benchmark, sweep, version, model))
        except (KeyError, TypeError, ValueError) as exc:
            raise UserError(f"{where}: not a GuideLLM {version} benchmark as expected ({exc!r})") from None
    return levels


def _level(where: str, strategy: dict[str, Any], sweep: bool, achieved: float) -> tuple[Mode, float]:
    kind = str(strategy.get("type_"))
    if sweep or kind == "throughput":
        if achieved <= 0:
            raise UserError(f"{where}: no requests over a duration, so no achieved rate to place it at")
        return Mode.OPEN, achieved
    if kind == "concurrent":
        return Mode.CLOSED, float(strategy["streams"])
    if kind == "synchronous":
        return Mode.CLOSED, 1.0
    if kind in RATE_STRATEGIES and strategy.get("rate"):
        return Mode.OPEN, float(strategy["rate"])
    raise UserError(f"{where}: GuideLLM strategy {kind!r} has no load level crossover can place; "
                    f"supported: sweep, throughput, {', '.join(sorted(CLOSED_STRATEGIES | RATE_STRATEGIES))}")


def _benchmark(path: Path, where: str, benchmark: dict[str, Any], sweep: bool, version: str,
               model: str) -> Measured:
    requests = benchmark["requests"]
    rows: list[dict[str, Any]] = []
    kinds = (("successful", ""), ("errored", "error"), ("incomplete", "cancelled"))
    for bucket, failure in kinds:
        for stats in requests.get(bucket) or []:
            info = stats.get("info") or {}
            error = ""
            if failure:
                error = str(info.get("error") or failure)
            output = int(stats.get("output_tokens") or 0)
            start = float(stats.get("request_start_time") or (info.get("timings") or {}).get("request_start")
                          or benchmark["start_time"])
            ttft = float(stats.get("time_to_first_token_ms") or 0.0) / 1000
            itl_mean = float(stats.get("inter_token_latency_ms") or 0.0) / 1000
            rows.append(request_row(
                index=len(rows), send_time=start, ttft=ttft, e2e=float(stats.get("request_latency") or 0.0),
                itl=[itl_mean] * max(0, output - 1), input_tokens=int(stats.get("prompt_tokens") or 0),
                output_tokens=output if not failure else 0, error=error,
                client_input_tokens=(stats.get("input_metrics") or {}).get("text_tokens"),
                client_output_tokens=(stats.get("output_metrics") or {}).get("text_tokens"),
                completion_id=str(stats.get("response_id") or "")))
    rows.sort(key=lambda r: r["send_time"])
    for index, row in enumerate(rows):
        row["index"] = index
    duration = float(benchmark.get("duration") or 0.0)
    achieved = len(rows) / duration if duration > 0 else 0.0
    mode, level = _level(where, benchmark["config"]["strategy"], sweep, achieved)
    measured = Measured(path, f"{TOOL} {version}", mode, level, rows, model,
                        tokens="the server's usage (GuideLLM prefers it); its text counts as client_*")
    metrics = benchmark.get("metrics") or {}
    ok = [r for r in rows if r["ok"]]
    totals = metrics.get("request_totals") or {}
    checks = [
        ("request count", totals.get("total"), float(len(rows))),
        ("successful requests", totals.get("successful"), float(len(ok))),
        ("mean TTFT (ms)", _mean(metrics, "time_to_first_token_ms"), mean([r["ttft"] * 1000 for r in ok])),
        ("mean request latency (s)", _mean(metrics, "request_latency"), mean([r["e2e"] for r in ok])),
    ]
    for what, tool_value, recomputed in checks:
        warning = check_aggregate(Path(where), what, tool_value, recomputed)
        if warning:
            measured.warnings.append(warning)
    return measured


def _mean(metrics: dict[str, Any], name: str) -> float | None:
    value = ((metrics.get(name) or {}).get("successful") or {}).get("mean")
    count = ((metrics.get(name) or {}).get("successful") or {}).get("count")
    return float(value) if value is not None and count else None
