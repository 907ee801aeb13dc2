"""AIPerf's artifact folder (`aiperf profile --artifact-dir DIR`; 0.13.x, export schema 1.x): the
run's `profile_export_aiperf.json` and its per-request `profile_export.jsonl` beside it (with
`--profile-export-prefix P`: P_aiperf.json and P.jsonl), one level per folder.

Field names from AIPerf 0.13.0 as installed (aiperf/common/models/record_models.py,
MetricRecordInfo {metadata {request_start_ns, benchmark_phase, was_cancelled}, metrics {name: {value,
unit}}, error {code, type, message}}; the run's JSON: {schema_version, aiperf_version,
input_config.phases [{kind, type, concurrency, rate}], <metric> {avg, sum, ...}}; phase types from
aiperf/config/schema/aiperf-config.schema.json: concurrency, constant, poisson, gamma).

The load level: the profiling phase's concurrency (type concurrency) or rate (constant, poisson,
gamma). Tokens: the server's usage (usage_prompt_tokens, usage_completion_tokens) where the stream
carried it, which the figures use; AIPerf's own tokenizer counts (input_sequence_length,
output_sequence_length) are kept as the client's. ITLs: its inter_chunk_latency list (one per
streamed chunk after the first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crossover.errors import UserError
from crossover.loadgen.analysis.imports.common import (
    Measured,
    check_aggregate,
    mean,
    read_jsonl,
    request_row,
    version_prefix,
)
from crossover.loadgen.plan import Mode

TOOL = "aiperf"
VERSIONS = ("0.13",)
SCHEMA_MAJOR = "1"
SUPPORTED = "AIPerf 0.13.x (export schema 1.x)"
RUN_SUFFIX = "_aiperf.json"
PROFILING = "profiling"
RATE_PHASES = ("constant", "poisson", "gamma")


def looks_like(data: Any) -> bool:
    return isinstance(data, dict) and "aiperf_version" in data


def requests_file(path: Path) -> Path:
    """The per-request JSONL beside a run's JSON: profile_export_aiperf.json -> profile_export.jsonl."""
    name = path.name[: -len(RUN_SUFFIX)] if path.name.endswith(RUN_SUFFIX) else path.stem
    return path.with_name(name + ".jsonl")


def check_version(path: Path, data: dict[str, Any]) -> None:
    version = str(data.get("aiperf_version") or "unknown")
    schema = str(data.get("schema_version") or "unknown")
    if version_prefix(version) not in VERSIONS or schema.split(".")[0] != SCHEMA_MAJOR:
        raise UserError(f"{path}: looks like an AIPerf {version} run (export schema {schema}); supported: "
                        f"{SUPPORTED}")


def _value(record: dict[str, Any], name: str) -> Any:
    metric = (record.get("metrics") or {}).get(name)
    return metric.get("value") if isinstance(metric, dict) else None


def _level(path: Path, data: dict[str, Any]) -> tuple[Mode, float]:
    phases = ((data.get("input_config") or {}).get("phases")) or []
    profiling = [p for p in phases if isinstance(p, dict) and p.get("kind", PROFILING) == PROFILING]
    if len(profiling) != 1:
        raise UserError(f"{path}: want one profiling phase in input_config.phases to place the run on a "
                        f"load axis, found {len(profiling)}")
    phase = profiling[0]
    if phase.get("type") == "concurrency" and phase.get("concurrency"):
        return Mode.CLOSED, float(phase["concurrency"])
    if phase.get("type") in RATE_PHASES and phase.get("rate"):
        return Mode.OPEN, float(phase["rate"])
    raise UserError(f"{path}: AIPerf phase type {phase.get('type')!r} has no load level crossover can place; "
                    f"supported: concurrency, {', '.join(RATE_PHASES)}")


def read(path: Path, data: dict[str, Any]) -> list[Measured]:
    check_version(path, data)
    jsonl = requests_file(path)
    if not jsonl.exists():
        raise UserError(f"{path}: no per-request {jsonl.name} beside it (AIPerf writes it with "
                        "--export-level records or raw)")
    mode, level = _level(path, data)
    records, dropped = read_jsonl(jsonl)
    measured = Measured(path.parent, f"{TOOL} {data.get('aiperf_version')}", mode, level, [],
                        model=", ".join(m.get("name", "") for m in ((data.get("input_config") or {})
                                                                     .get("models") or {}).get("items", [])),
                        tokens="the server's usage where the stream carried it; AIPerf's tokenizer "
                               "counts as client_*")
    if dropped:
        measured.warnings.append(f"{jsonl}: {dropped} incomplete line(s) dropped, {len(records)} complete "
                                 "request(s) kept")
    rows: list[dict[str, Any]] = []
    for record in records:
        metadata = record.get("metadata") or {}
        if metadata.get("benchmark_phase", PROFILING) != PROFILING:
            continue  # warmup requests are not the run's
        error, status = "", 0
        if record.get("error"):
            details = record["error"]
            error = (str(details.get("message") or details.get("type") or "error")
                     if isinstance(details, dict) else str(details))
            code = details.get("code") if isinstance(details, dict) else None
            status = code if isinstance(code, int) else 0
        elif metadata.get("was_cancelled"):
            error = "cancelled"
        client_in = _value(record, "input_sequence_length")
        client_out = _value(record, "output_sequence_length")
        server_in = _value(record, "usage_prompt_tokens")
        server_out = _value(record, "usage_completion_tokens")
        output = int(server_out if server_out is not None else client_out or 0)
        itl = [float(x) / 1000 for x in (_value(record, "inter_chunk_latency") or [])]
        rows.append(request_row(
            index=0, send_time=float(metadata.get("request_start_ns") or 0) / 1e9,
            ttft=float(_value(record, "time_to_first_token") or 0.0) / 1000,
            e2e=float(_value(record, "request_latency") or 0.0) / 1000, itl=itl,
            input_tokens=int(server_in if server_in is not None else client_in or 0), output_tokens=output,
            error=error, status=status, client_input_tokens=None if client_in is None else int(client_in),
            client_output_tokens=None if client_out is None else int(client_out),
            completion_id=str(metadata.get("x_request_id") or "")))
    rows.sort(key=lambda r: r["send_time"])
    for index, row in enumerate(rows):
        row["index"] = index
    measured.rows = rows
    ok = [r for r in rows if r["ok"]]
    checks = [
        ("request count", _avg(data, "request_count"), float(len(ok))),
        ("error request count", _avg(data, "error_request_count"), float(len(rows) - len(ok))),
        ("mean TTFT (ms)", _avg(data, "time_to_first_token"), mean([r["ttft"] * 1000 for r in ok])),
        ("mean request latency (ms)", _avg(data, "request_latency"), mean([r["e2e"] * 1000 for r in ok])),
        ("output sequence length total", _sum(data, "output_sequence_length"),
         float(sum(r["client_output_tokens"] for r in ok))),
    ]
    if not dropped:  # a cut file's requests cannot add up to the run's figures
        for what, tool_value, recomputed in checks:
            warning = check_aggregate(path, what, tool_value, recomputed)
            if warning:
                measured.warnings.append(warning)
    return [measured]


def _avg(data: dict[str, Any], name: str) -> float | None:
    metric = data.get(name)
    return float(metric["avg"]) if isinstance(metric, dict) and metric.get("avg") is not None else None


def _sum(data: dict[str, Any], name: str) -> float | None:
    metric = data.get(name)
    return float(metric["sum"]) if isinstance(metric, dict) and metric.get("sum") is not None else None
