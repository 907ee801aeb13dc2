"""Result files in the `vllm bench serve --save-result [--save-detailed]` format, both ways.

`bench_result` writes one (topology, level) of a sweep with the field names and meanings of the
pinned vLLM's vllm/benchmarks/serve.py (duration from the first send to the last end, throughputs
over it, `mean_/median_/std_/pNN_<metric>_ms` for the chosen metrics and percentiles, and with
detailed fields the per-request lists), so notebooks written for vllm bench read a sweep.
`read_bench_results` turns such files, written by vllm bench itself or by a sweep, back into the
sweep's requests table, so `crossover analyze` finds the crossover in results users already have.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from crossover import slo
from crossover.errors import UserError
from crossover.loadgen.analysis.summary import latency_samples, mark_requests
from crossover.loadgen.plan import Mode

PERCENTILE_METRICS = slo.SLO_KINDS
DEFAULT_PERCENTILE_METRICS = ("ttft", "tpot", "itl")  # as vllm bench serve, for generative models
DEFAULT_METRIC_PERCENTILES = (99.0,)
DETAILED_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "start_times", "generated_texts", "errors")
BACKENDS = {"completions": "openai", "chat": "openai-chat"}


@dataclass(frozen=True)
class BenchOptions:
    """The `vllm bench serve` reporting flags: which metrics get percentiles, which percentiles,
    and whether the per-request lists are kept (--save-detailed)."""

    percentile_metrics: tuple[str, ...] = DEFAULT_PERCENTILE_METRICS
    metric_percentiles: tuple[float, ...] = DEFAULT_METRIC_PERCENTILES
    detailed: bool = False

    @classmethod
    def parse(cls, metrics: str | None, percentiles: str | None, detailed: bool) -> BenchOptions:
        names = (metrics or ",".join(DEFAULT_PERCENTILE_METRICS)).split(",")
        chosen = tuple(m.strip() for m in names if m.strip())
        unknown = [m for m in chosen if m not in PERCENTILE_METRICS]
        if unknown or not chosen:
            raise UserError(f"--percentile-metrics: want some of {','.join(PERCENTILE_METRICS)}, "
                            f"got {metrics!r}")
        try:
            values = tuple(float(p) for p in (percentiles or "99").split(",") if p.strip())
        except ValueError:
            values = ()
        if not values or any(not 0 < p <= 100 for p in values):
            raise UserError("--metric-percentiles: want numbers in (0, 100] separated by commas, "
                            f"got {percentiles!r}")
        return cls(chosen, values, detailed)


def _stats(values: np.ndarray, name: str, percentiles: Sequence[float]) -> dict[str, float]:
    data = values if values.size else np.zeros(1)  # vllm bench reports 0 for no data
    out = {f"mean_{name}_ms": float(np.mean(data)) * 1000,
           f"median_{name}_ms": float(np.median(data)) * 1000,
           f"std_{name}_ms": float(np.std(data)) * 1000}
    for p in percentiles:
        word = str(int(p)) if int(p) == p else str(p)
        out[f"p{word}_{name}_ms"] = float(np.percentile(data, p)) * 1000
    return out


def bench_result(requests: pd.DataFrame, *, topology: str, level: float, mode: Mode, model: str,
                 endpoint: str, tokenizer: str, burstiness: float, slos_ms: dict[str, float],
                 options: BenchOptions) -> dict[str, Any]:
    """One (topology, level) as `vllm bench serve` writes it (its calculate_metrics: over the whole
    level, percentiles over successful requests, TPOT 0 for one output token; goodput counts the
    requests the SLO module's definition calls good, which for ttft, tpot and e2el is vllm's)."""
    ordered = requests.sort_values("send_time", kind="stable")
    ok = ordered[ordered["ok"].astype(bool)]
    duration = float(ordered["end_time"].max() - ordered["send_time"].min()) if len(ordered) else 0.0
    rate = 1.0 / duration if duration > 0 else 0.0
    total_input = int(ok["input_tokens"].sum())
    total_output = int(ok["output_tokens"].sum())
    good = int(mark_requests(ordered, slos_ms)["good"].sum()) if len(ordered) else 0
    result: dict[str, Any] = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "endpoint_type": BACKENDS[endpoint],
        "backend": BACKENDS[endpoint], "label": "crossover", "model_id": model, "tokenizer_id": tokenizer,
        "num_prompts": len(ordered), "topology": topology,
        "request_rate": level if mode is Mode.OPEN else "inf", "burstiness": burstiness,
        "max_concurrency": int(level) if mode is Mode.CLOSED else None,
        "duration": duration, "completed": len(ok), "failed": len(ordered) - len(ok),
        "total_input_tokens": total_input, "total_output_tokens": total_output,
        "request_throughput": len(ok) * rate,
        "request_goodput": good * rate if slos_ms else None,
        "output_throughput": total_output * rate,
        "total_token_throughput": (total_input + total_output) * rate,
        "max_concurrent_requests": _max_in_flight(ordered),
    }
    for name in options.percentile_metrics:
        result.update(_stats(latency_samples(ordered, name), name, options.metric_percentiles))
    if options.detailed:
        start = float(ordered["send_time"].min()) if len(ordered) else 0.0
        result.update({
            "input_lens": ordered["input_tokens"].astype(int).tolist(),
            "output_lens": ordered["output_tokens"].astype(int).tolist(),
            "ttfts": [float(v) if math.isfinite(v) else 0.0 for v in ordered["ttft"]],
            "itls": [list(map(float, v)) for v in ordered["itl"]],
            "start_times": (ordered["send_time"] - start).tolist(),
            "generated_texts": [""] * len(ordered), "errors": ordered["error"].astype(str).tolist(),
        })
    return result


def _max_in_flight(requests: pd.DataFrame) -> int:
    events = sorted([(t, 1) for t in requests["send_time"]] + [(t, -1) for t in requests["end_time"]],
                    key=lambda e: (e[0], e[1]))
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


# --- reading -----------------------------------------------------------------------------------

@dataclass
class BenchFile:
    path: Path
    topology: str
    level: float
    mode: Mode  # the load axis: concurrency (max_concurrency, request_rate inf) or rate
    data: dict[str, Any]


def is_bench_result(data: Any) -> bool:
    """A vllm bench serve result (or a sweep's --save-result file): its aggregate fields are there."""
    return isinstance(data, dict) and "completed" in data and "duration" in data


def bench_file(path: Path, data: dict[str, Any]) -> BenchFile:
    """A vllm bench result file, checked; its topology from `--metadata topology=NAME` ("" without:
    crossover.loadgen.analysis.imports names it from the file's place)."""
    missing = [f for f in DETAILED_FIELDS if f != "generated_texts" and f not in data]
    if missing:
        raise UserError(f"{path}: no per-request fields ({', '.join(missing)}); write it with "
                        "vllm bench serve --save-result --save-detailed")
    concurrency, rate = data.get("max_concurrency"), data.get("request_rate")
    if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate)):
        if not isinstance(concurrency, int) or concurrency < 1:
            raise UserError(f"{path}: neither a request rate nor a max concurrency to place it on a "
                            "load axis")
        mode, level = Mode.CLOSED, float(concurrency)
    else:
        mode, level = Mode.OPEN, float(rate)
    return BenchFile(path, str(data.get("topology") or ""), level, mode, data)


def read_bench_results(paths: Iterable[str]) -> list[BenchFile]:
    """Every vllm bench result file under the given files and folders, checked, each with its
    topology (`--metadata topology=NAME`, else named by its place as every tool's results are)."""
    from crossover.loadgen.analysis.imports import BENCH_TOOL, read_results

    names = list(paths)
    results = read_results(names)
    files = []
    for level in results.levels:
        if level.tool == BENCH_TOOL:
            data = json.loads(level.path.read_text())
            files.append(BenchFile(level.path, level.topology, level.level, level.mode, data))
    if not files:
        raise UserError(f"{', '.join(names)}: no vllm bench serve result files there")
    return files


def requests_frame(file: BenchFile, topology: str | None = None) -> pd.DataFrame:
    """The sweep's requests table from one detailed result file (e2e = TTFT + the ITLs, as vllm
    bench's timeline does; a request failed when its error is not empty)."""
    data = file.data
    topology = topology or file.topology
    n = len(data["ttfts"])
    lists = [data[f] for f in ("input_lens", "output_lens", "itls", "start_times", "errors")]
    if any(not isinstance(v, list) or len(v) != n for v in lists):
        raise UserError(f"{file.path}: the per-request lists have different lengths")
    rows = []
    nan = float("nan")
    for i in range(n):
        error = str(data["errors"][i] or "")
        itl = [float(x) for x in (data["itls"][i] or [])]
        ttft = float(data["ttfts"][i] or 0.0)
        output = int(data["output_lens"][i] or 0)
        ok = not error and output > 0
        e2e = ttft + sum(itl)
        start = float(data["start_times"][i])
        rows.append({
            "topology": topology, "level": file.level, "index": i, "instance": "", "send_time": start,
            "end_time": start + (e2e if ok else 0.0), "ok": ok, "status": 200 if ok else 0, "error": error,
            "ttft": ttft if ok else nan, "e2e": e2e if ok else nan,
            "tpot": slo.tpot(e2e - ttft, output) if ok else nan,
            "itl": itl if ok else [], "itl_max": (max(itl) if itl else 0.0) if ok else nan,
            "chunk_times": [], "chunk_tokens": [], "input_tokens": int(data["input_lens"][i] or 0),
            "output_tokens": output if ok else 0, "planned_input": int(data["input_lens"][i] or 0),
            "planned_output": output, "completion_id": "", "garbage": 0})
    return pd.DataFrame(rows)
