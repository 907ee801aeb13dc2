"""What every importer shares: one measured level (`Measured`), a request as the sweep's requests
table holds it (`request_row`), the check of a tool's aggregates against its requests, and JSON,
YAML and JSONL reading with one-line errors."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from crossover import slo
from crossover.errors import UserError
from crossover.loadgen.plan import Mode
from crossover.loadgen.traffic.client import RequestRecord

# A tool's aggregate and the same figure recomputed from its requests agree within this share (both
# come from the same numbers; only float rounding and the tool's own arithmetic separate them).
AGGREGATE_REL_TOL = 1e-3
# The requests table's extra columns of imported levels: the tool's own token counts, kept beside
# the server's usage that input_tokens and output_tokens hold wherever the tool recorded it.
CLIENT_INPUT_TOKENS = "client_input_tokens"
CLIENT_OUTPUT_TOKENS = "client_output_tokens"


@dataclass
class Measured:
    """One load level of one tool's results, before its topology is known."""

    path: Path  # the file (or artifact folder) it came from
    tool: str  # "guidellm 0.8.1"
    mode: Mode
    level: float
    rows: list[dict[str, Any]]  # request_row()s
    model: str = ""
    tokens: str = ""  # which token counts input_tokens/output_tokens hold
    warnings: list[str] = field(default_factory=list)


def request_row(*, index: int, send_time: float, ttft: float, e2e: float, itl: Sequence[float],
                input_tokens: int, output_tokens: int, error: str = "", status: int = 0,
                client_input_tokens: int | None = None, client_output_tokens: int | None = None,
                completion_id: str = "") -> dict[str, Any]:
    """A request as the sweep's requests table holds it (loadgen.traffic.client.RequestRecord, its
    one definition; topology and level are set by the reader). Times in seconds; a request is ok
    when it has no error and output tokens; TPOT as vllm bench defines it, (e2e - TTFT) / (output -
    1), 0 for one token; failed requests keep NaN latencies and count as not good (crossover.slo)."""
    ok = not error and output_tokens > 0
    nan = float("nan")
    gaps = [float(x) for x in itl] if ok else []
    record = RequestRecord(
        topology="", level=0.0, index=index, instance="", send_time=send_time,
        end_time=send_time + (e2e if ok and math.isfinite(e2e) else 0.0), ok=ok, status=200 if ok else status,
        error=error, ttft=ttft if ok else nan, e2e=e2e if ok else nan,
        tpot=slo.tpot(e2e - ttft, output_tokens) if ok else nan,
        itl=gaps, itl_max=(max(gaps) if gaps else 0.0) if ok else nan, chunk_times=[], chunk_tokens=[],
        input_tokens=input_tokens, output_tokens=output_tokens if ok else 0, planned_input=input_tokens,
        planned_output=output_tokens, completion_id=completion_id, garbage=0, shared_reads=0)
    row = asdict(record)
    row[CLIENT_INPUT_TOKENS] = client_input_tokens if client_input_tokens is not None else input_tokens
    row[CLIENT_OUTPUT_TOKENS] = client_output_tokens if client_output_tokens is not None else output_tokens
    return row


def check_aggregate(path: Path, what: str, tool_value: float | None, recomputed: float) -> str | None:
    """A warning when the tool's aggregate differs from the one recomputed from its requests."""
    if tool_value is None or not math.isfinite(recomputed):
        return None
    if math.isclose(float(tool_value), recomputed, rel_tol=AGGREGATE_REL_TOL, abs_tol=1e-9):
        return None
    return (f"{path}: the tool's {what} is {float(tool_value):.6g}, recomputed from its requests "
            f"{recomputed:.6g}")


def mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return math.fsum(finite) / len(finite) if finite else float("nan")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(f"{path}: cannot read it as JSON ({exc})") from None


def read_yaml(path: Path) -> Any:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # GuideLLM's YAML runs to megabytes
    try:
        return yaml.load(path.read_text(), Loader=loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"{path}: cannot read it as YAML ({reason})") from None


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The complete JSON objects of a JSONL file and how many lines were dropped (a run killed while
    writing leaves a cut last line; any line that is not a JSON object is dropped and counted)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read it ({exc})") from None
    records: list[dict[str, Any]] = []
    dropped = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            dropped += 1
            continue
        if isinstance(value, dict):
            records.append(value)
        else:
            dropped += 1
    return records, dropped


def version_prefix(version: str, parts: int = 2) -> str:
    """"0.8.1" -> "0.8"."""
    return ".".join(str(version).split(".")[:parts])
