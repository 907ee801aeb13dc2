"""inference-perf's reports (0.7.x; the reports carry no version): the per-stage reports
`stage_N_lifecycle_metrics.json` (one level each) and the per-request report
`per_request_lifecycle_metrics.json` beside them (`report.request_lifecycle.per_request: true`; the
per-stage ones alone hold no requests to judge SLOs on).

Field names from inference-perf 0.7.0 as installed (inference_perf/reportgen/base.py:
summarize_requests' load_summary {count, requested_rate, concurrency}, successes {count, latency
{time_to_first_token, request_latency {mean}}}; build_per_request_lifecycle_entry {start_time,
end_time, info {request_metrics.text.input_tokens, response_metrics {output_tokens, server_usage,
chunk_times}}, computed_metrics {time_to_first_token, request_latency, inter_token_latencies},
error}).

The per-request entries do not name their stage; stages run one after the other, so the entries in
order of start time are dealt to the stages by each stage's load_summary.count, and each stage's
figures are checked against its report. The load level: the stage's concurrency (concurrent load)
or its requested rate. Tokens: the server's usage (prompt_tokens, completion_tokens), which the
figures use; inference-perf's tokenizer counts are kept as the client's.
"""

from __future__ import annotations

import re
from itertools import pairwise
from pathlib import Path
from typing import Any

from crossover.errors import UserError
from crossover.loadgen.analysis.imports.common import Measured, check_aggregate, mean, read_json, request_row
from crossover.loadgen.plan import Mode

TOOL = "inference-perf"
SUPPORTED = "inference-perf 0.7.x per-stage reports with the per-request report beside them"
STAGE = re.compile(r"^(?P<prefix>.*)stage_(?P<stage>\d+)_lifecycle_metrics\.json$")
PER_REQUEST = "per_request_lifecycle_metrics.json"


def is_stage_report(path: Path) -> bool:
    return STAGE.match(path.name) is not None and not path.name.startswith("adapter_")


def read_folder(stage_paths: list[Path]) -> list[Measured]:
    """Every stage report of one folder (same prefix) with the per-request report beside them."""
    first = stage_paths[0]
    match = STAGE.match(first.name)
    assert match is not None
    per_request = first.with_name(match["prefix"] + PER_REQUEST)
    if not per_request.exists():
        raise UserError(f"{first}: looks like an inference-perf per-stage report, but no {per_request.name} "
                        f"beside it; supported: {SUPPORTED} (report.request_lifecycle.per_request: true)")
    stages = sorted(((int(STAGE.match(p.name)["stage"]), p) for p in stage_paths),  # type: ignore[index]
                    key=lambda s: s[0])
    entries = read_json(per_request)
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "start_time" in e for e in entries):
        raise UserError(f"{per_request}: not an inference-perf per-request report (a list of requests with "
                        f"start_time); supported: {SUPPORTED}")
    entries = sorted(entries, key=lambda e: float(e["start_time"]))
    reports = [(number, path, read_json(path)) for number, path in stages]
    counts = []
    for _, path, report in reports:
        summary = report.get("load_summary") if isinstance(report, dict) else None
        if not isinstance(summary, dict) or "count" not in summary:
            raise UserError(f"{path}: no load_summary.count; supported: {SUPPORTED}")
        counts.append(int(summary["count"]))
    if sum(counts) != len(entries):
        raise UserError(f"{per_request}: {len(entries)} requests, but the stage reports beside it count "
                        f"{sum(counts)}; give the per-stage and per-request reports of one run")
    levels = []
    start = 0
    for (_, path, report), count in zip(reports, counts, strict=True):
        levels.append(_stage(path, report, entries[start:start + count]))
        start += count
    return levels


def _stage(path: Path, report: dict[str, Any], entries: list[dict[str, Any]]) -> Measured:
    summary = report["load_summary"]
    if summary.get("concurrency"):
        mode, level = Mode.CLOSED, float(summary["concurrency"])
    elif summary.get("requested_rate"):
        mode, level = Mode.OPEN, float(summary["requested_rate"])
    else:
        raise UserError(f"{path}: neither a concurrency nor a requested rate in load_summary to place "
                        "it on a load axis")
    rows: list[dict[str, Any]] = []
    for entry in entries:
        info = entry.get("info") or {}
        response = info.get("response_metrics") or {}
        usage = response.get("server_usage") or {}
        computed = entry.get("computed_metrics") or {}
        chunks = [float(t) for t in response.get("chunk_times") or []]
        send = float(entry["start_time"])
        error = ""
        if entry.get("error"):
            details = entry["error"]
            error = str(details.get("error_msg") or details.get("error_type") or "error") \
                if isinstance(details, dict) else str(details)
        ttft = computed.get("time_to_first_token", chunks[0] - send if chunks else 0.0)
        itl = computed.get("inter_token_latencies", [b - a for a, b in pairwise(chunks)])
        client_in = ((info.get("request_metrics") or {}).get("text") or {}).get("input_tokens")
        client_out = response.get("output_tokens")
        output = usage.get("completion_tokens", client_out)
        rows.append(request_row(
            index=len(rows), send_time=send, ttft=float(ttft),
            e2e=float(computed.get("request_latency", float(entry["end_time"]) - send)), itl=itl,
            input_tokens=int(usage.get("prompt_tokens", client_in) or 0), output_tokens=int(output or 0),
            error=error, client_input_tokens=None if client_in is None else int(client_in),
            client_output_tokens=None if client_out is None else int(client_out)))
    measured = Measured(path, TOOL, mode, level, rows,
                        tokens="the server's usage; inference-perf's tokenizer counts as client_*")
    ok = [r for r in rows if r["ok"]]
    latency = (report.get("successes") or {}).get("latency") or {}
    checks = [
        ("successful requests", (report.get("successes") or {}).get("count"), float(len(ok))),
        ("mean TTFT (s)", (latency.get("time_to_first_token") or {}).get("mean"),
         mean([r["ttft"] for r in ok])),
        ("mean request latency (s)", (latency.get("request_latency") or {}).get("mean"),
         mean([r["e2e"] for r in ok])),
    ]
    for what, tool_value, recomputed in checks:
        warning = check_aggregate(path, what, tool_value, recomputed)
        if warning:
            measured.warnings.append(warning)
    return measured
