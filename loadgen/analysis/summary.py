"""From the requests table to one row per topology x level: goodput, attainment, percentiles,
throughput in total and per GPU. Pure pandas, no I/O: the app and the tests feed it directly.

Definitions (crossover.slo, docs/sweep.md):
- A request is good when it finished and every SLO given is met, value <= SLO, with TPOT as
  `vllm bench serve` defines it (0 for one output token); the ITL SLO holds when every one of the
  request's inter-token latencies meets it. Failed requests are never good; requests refused as
  bad input (HTTP 4xx, slo.is_client_error) are not the fleet's to serve and are not counted.
- Steady-state window of a level: from its first send + warmup_s to its last end - cooldown_s;
  only requests sent and finished inside it count, and rates divide by its length. A level
  measured more than once (adaptive repeats, column `repeat`) has one window per repeat: its
  requests are pooled (quantiles over all of them) and rates divide by the windows' summed length.
- Rates: open loop, counts over the window (as `vllm bench serve` divides by its duration);
  closed loop at concurrency C, by Little's law: C x count / total time the counted requests were
  in flight, which the drain at a level's end does not bias (`output_tps_window` keeps the
  count / window figure for comparison).
- Request goodput = good requests per second; token goodput = their output tokens per second;
  attainment = good / counted requests (failed included), joint and per SLO.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from crossover import slo
from crossover.loadgen.plan import Mode, SweepPlan

# Planned and server-counted prompt lengths agree when they differ by at most this share or this
# many tokens (the larger): beyond it, the level measured another workload than the one asked for.
INPUT_LEN_TOLERANCE = 0.01
INPUT_LEN_TOLERANCE_TOKENS = 2.0
# Above this share of token events stamped with a socket read they shared, a level's TTFT and ITL
# are the reads' rather than the tokens' (loadgen/traffic/client.py, _CompletionSink.feed).
SHARED_READS_LIMIT = 0.05
# The requests column each SLO kind judges a request by (ITL: its worst gap).
SOURCE_COLUMN = {"ttft": "ttft", "tpot": "tpot", "itl": "itl_max", "e2el": "e2e"}
# The requests column holding each latency kind's samples (ITL: a list per request).
SAMPLE_COLUMN = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}


def sampled(requests: pd.DataFrame, kind: str) -> np.ndarray:
    """Per row, whether the request gives `kind` samples: it finished, and for TPOT it has more than
    one output token (as `vllm bench serve` leaves those out)."""
    ok = requests["ok"].to_numpy(bool)
    return ok & (requests["output_tokens"].to_numpy() > 1) if kind == "tpot" else ok


def request_latencies(requests: pd.DataFrame, kind: str) -> np.ndarray:
    """Per row, the request's `kind` latency in seconds, NaN where it gives no sample (see `sampled`)."""
    return np.where(sampled(requests, kind), requests[SAMPLE_COLUMN[kind]].to_numpy(float), np.nan)


def request_itls(requests: pd.DataFrame) -> list[np.ndarray]:
    """Per row, the request's inter-token latencies in seconds (none for a failed request)."""
    return [np.asarray(itl, float) if ok else np.empty(0)
            for itl, ok in zip(requests["itl"], sampled(requests, "itl"), strict=True)]


def latency_samples(requests: pd.DataFrame, kind: str) -> np.ndarray:
    """The `kind` latencies in seconds that its mean and percentiles are taken over: one per request
    that gives a sample, and for ITL every inter-token latency of them pooled."""
    if kind == "itl":
        return np.concatenate([np.empty(0), *request_itls(requests)])
    return requests[SAMPLE_COLUMN[kind]].to_numpy(float)[sampled(requests, kind)]


def mark_requests(requests: pd.DataFrame, slos_ms: Mapping[str, float],
                  plan: SweepPlan | None = None) -> pd.DataFrame:
    """The requests with `in_window`, `counted` (in the window and not a client error), `good_<slo>`
    per SLO and `good` (all SLOs) columns added."""
    marked = requests.copy()
    if marked.empty:
        for column in ("in_window", "counted", "good", *(f"good_{s}" for s in slos_ms)):
            marked[column] = pd.Series(dtype=bool)
        return marked
    warmup = plan.warmup_s if plan else 0.0
    cooldown = plan.cooldown_s if plan else 0.0
    if "repeat" not in marked:
        marked["repeat"] = 1
    groups = marked.groupby(["topology", "level", "repeat"], sort=False)
    start = groups["send_time"].transform("min") + warmup
    end = groups["end_time"].transform("max") - cooldown
    marked["window_start"] = start
    marked["window_end"] = end
    marked["in_window"] = (marked["send_time"] >= start) & (marked["end_time"] <= end)
    client_error = marked["status"].map(slo.is_client_error).astype(bool)
    marked["counted"] = marked["in_window"] & ~client_error
    good = marked["ok"].astype(bool)
    for kind, threshold_ms in slos_ms.items():
        met = marked["ok"].astype(bool) & (marked[SOURCE_COLUMN[kind]] <= threshold_ms / 1000.0)
        marked[f"good_{kind}"] = met
        good &= met
    marked["good"] = good
    return marked


def percentile(values: np.ndarray, q: float) -> float:
    """The q-quantile of the finite values (NaN without any), as every percentile column takes it."""
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q * 100)) if finite.size else float("nan")


def _percentiles(values: np.ndarray, name: str) -> dict[str, float]:
    ms = values * 1000.0
    finite = ms[np.isfinite(ms)]
    row = {f"{name}_mean_ms": float(finite.mean()) if finite.size else float("nan")}
    row.update({slo.percentile_column(name, q): percentile(ms, q) for q in slo.QUANTILES})
    return row


def per_gpu(column: str) -> str:
    """The summary column of `column` over the topology's GPUs."""
    return f"{column}_per_gpu"


def _level_row(group: pd.DataFrame, slos_ms: Mapping[str, float], gpus: int, level: float,
               closed_loop: bool) -> dict[str, float]:
    counted = group[group["counted"]]
    windows = group.groupby("repeat")[["window_start", "window_end"]].first()
    duration = float((windows["window_end"] - windows["window_start"]).sum())
    window_rate = 1.0 / duration if duration > 0 else float("nan")
    if closed_loop:
        # Little's law: `level` requests are always in flight, so a rate is level x count / the
        # time the counted requests spent in flight. Unlike count / window, the drain at the end
        # of a level (fewer than `level` in flight while the slowest finish) does not bias it.
        busy = float((counted["end_time"] - counted["send_time"]).sum())
        rate = level / busy if busy > 0 else float("nan")
    else:
        rate = window_rate
    finished = counted[counted["ok"]]
    good = counted[counted["good"]]
    n = len(counted)
    output_tokens = float(finished["output_tokens"].sum())
    row: dict[str, float] = {
        "gpus": gpus, "repeats": len(windows), "requests_sent": len(group), "requests": n,
        "ok": len(finished), "failed": n - len(finished), "duration_s": duration,
        "send_rate": n * window_rate, "achieved_rate": len(finished) * rate,
        "output_tps": output_tokens * rate,
        "output_tps_window": output_tokens * window_rate,
        "total_tps": (output_tokens + float(finished["input_tokens"].sum())) * rate,
        slo.GOODPUT_REQUESTS: len(good) * rate, slo.GOODPUT_TOKENS: float(good["output_tokens"].sum()) * rate,
        slo.attainment_column(): len(good) / n if n else float("nan"),
        "client_errors": int((group["in_window"] & ~group["counted"]).sum()),
    }
    for kind in slos_ms:
        row[slo.attainment_column(kind)] = float(counted[f"good_{kind}"].sum()) / n if n else float("nan")
    for name in ("output_tps", "total_tps", slo.GOODPUT_REQUESTS, slo.GOODPUT_TOKENS):
        row[per_gpu(name)] = row[name] / gpus
    for kind in slo.SLO_KINDS:
        row.update(_percentiles(latency_samples(finished, kind), kind))
    row.update(_input_lengths(finished))
    row["shared_read_share"] = _shared_read_share(finished)
    errors = counted.loc[~counted["ok"], "error"]
    row["top_error"] = str(errors.value_counts().index[0]) if len(errors) else ""  # type: ignore[assignment]
    return row


def input_len_off(planned: float, counted: float) -> bool:
    """Whether the server counted prompts of another length than planned (see INPUT_LEN_TOLERANCE)."""
    if not (np.isfinite(planned) and np.isfinite(counted)):
        return False
    return abs(counted - planned) > max(INPUT_LEN_TOLERANCE * planned, INPUT_LEN_TOLERANCE_TOKENS)


def _input_lengths(finished: pd.DataFrame) -> dict[str, float]:
    """Mean planned and server-counted prompt tokens per request, and whether they disagree."""
    if finished.empty or "planned_input" not in finished:
        return {"input_tokens_planned": float("nan"), "input_tokens_counted": float("nan"),
                "input_len_off": False}
    planned = float(finished["planned_input"].mean())
    counted = float(finished["input_tokens"].mean())
    return {"input_tokens_planned": planned, "input_tokens_counted": counted,
            "input_len_off": input_len_off(planned, counted)}


def _shared_read_share(finished: pd.DataFrame) -> float:
    """Of the token events, the share that came in a socket read with another of their stream
    (NaN for records that did not count them: older runs, imported files)."""
    if finished.empty or "shared_reads" not in finished:
        return float("nan")
    events = sum(len(times) for times in finished["chunk_times"])
    return float(finished["shared_reads"].sum()) / events if events else float("nan")


def level_warnings(summary: pd.DataFrame) -> list[str]:
    """One line per (topology, level) and thing that makes its figures other than asked: prompts
    the server counted at another length than planned, stamps shared by several token events."""
    if summary is None or summary.empty:
        return []
    lines = []
    for row in summary.to_dict("records"):
        where = f"{row['topology']} at {float(row['level']):g}"
        if row.get("input_len_off"):
            lines.append(f"{where}: the server counted {row['input_tokens_counted']:.1f} input tokens per "
                         f"request, {row['input_tokens_planned']:.1f} planned (the prompts were not the "
                         "asked length)")
        if row.get("shared_read_share", 0.0) > SHARED_READS_LIMIT:
            lines.append(f"{where}: {row['shared_read_share']:.0%} of the token events came in one socket "
                         "read with another, so they carry that read's time and TTFT and ITL read late "
                         "by up to the gaps between them: the client fell behind (add --workers) or the "
                         "server wrote them together")
    return lines


def turn_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per (topology, level, turn) of a multi-turn sweep: how many turns finished, their
    mean counted input, and TTFT and ITL percentiles (a later turn's prompt holds the history, so
    prefix caching shows here first)."""
    if requests.empty or "turn" not in requests or requests["turn"].max() <= 1:
        return pd.DataFrame(columns=["topology", "level", "turn", "requests"])
    rows = []
    for (topology, level, turn), group in requests.groupby(["topology", "level", "turn"], sort=True):
        finished = group[group["ok"].astype(bool)]
        row = {"topology": topology, "level": float(level), "turn": int(turn),  # type: ignore[arg-type,call-overload]
               "requests": len(group), "failed": len(group) - len(finished),
               "input_tokens": float(finished["input_tokens"].mean())}
        for kind in ("ttft", "itl"):
            row.update(_percentiles(latency_samples(finished, kind), kind))
        rows.append(row)
    return pd.DataFrame(rows)


def summarize(requests: pd.DataFrame, slos_ms: Mapping[str, float], gpus: Mapping[str, int],
              plan: SweepPlan | None = None) -> pd.DataFrame:
    """One row per (topology, level), sorted; columns documented in docs/sweep.md."""
    if requests.empty:
        return pd.DataFrame(columns=["topology", "level", "gpus", "requests", slo.GOODPUT_REQUESTS])
    marked = mark_requests(requests, slos_ms, plan)
    closed_loop = plan is None or plan.mode is Mode.CLOSED
    rows = []
    for (topology, level), group in marked.groupby(["topology", "level"], sort=True):
        row = {"topology": topology, "level": float(level)}  # type: ignore[arg-type]
        row.update(_level_row(group, slos_ms, int(gpus.get(str(topology), 1)), float(level),  # type: ignore[arg-type]
                              closed_loop))
        row["offered_rate"] = float(level) if plan is not None and plan.mode is Mode.OPEN else float("nan")  # type: ignore[arg-type]
        rows.append(row)
    return pd.DataFrame(rows)


def summarize_repeats(requests: pd.DataFrame, slos_ms: Mapping[str, float], gpus: Mapping[str, int],
                      plan: SweepPlan | None = None, pooled: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per (topology, level, repeat): each measurement of a level on its own, so the
    spread between them shows the chance of one arrival sequence that the pooled row averages.
    `pooled` (summarize's rows of the same requests) are those rows when no level was repeated."""
    if requests.empty or "repeat" not in requests or not (requests["repeat"] > 1).any():
        return (pooled if pooled is not None else summarize(requests, slos_ms, gpus, plan)).assign(repeat=1)
    frames = [summarize(requests[requests["repeat"] == repeat], slos_ms, gpus, plan).assign(repeat=repeat)
              for repeat in sorted(int(r) for r in requests["repeat"].unique())]
    return pd.concat(frames, ignore_index=True)
