"""Summaries: goodput exactly as `vllm bench serve --goodput` counts it, failures never good,
steady-state trimming, per-GPU figures."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from crossover import slo
from crossover.loadgen.analysis.summary import level_warnings, mark_requests, per_gpu, summarize
from crossover.loadgen.plan import Mode, SweepPlan

OPEN = SweepPlan(mode=Mode.OPEN, levels=(1.0,), requests_per_level=1)


def _row(topology: str, level: float, index: int, send: float, ttft: float, e2e: float, tokens: int,
         ok: bool = True, itl: list[float] | None = None) -> dict:
    tpot = (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0
    itl = itl if itl is not None else ([tpot] * (tokens - 1) if ok else [])
    nan = float("nan")
    return {"topology": topology, "level": level, "index": index, "instance": "u", "send_time": send,
            "end_time": send + e2e, "ok": ok, "status": 200 if ok else 503, "error": "" if ok else "HTTP 503",
            "ttft": ttft if ok else nan, "e2e": e2e if ok else nan, "tpot": tpot if ok else nan, "itl": itl,
            "itl_max": max(itl) if itl else (0.0 if ok else nan), "chunk_times": [], "chunk_tokens": [],
            "input_tokens": 100, "output_tokens": tokens if ok else 0, "planned_input": 100,
            "planned_output": tokens, "completion_id": "", "garbage": 0}


def _vllm_bench_good(frame: pd.DataFrame, slos_ms: dict[str, float]) -> int:
    """calculate_metrics() of vllm/benchmarks/serve.py, transcribed: successful requests only,
    tpot 0 for one token, good when every SLO >= value."""
    good = 0
    for _, r in frame[frame["ok"]].iterrows():
        n = r["output_tokens"]
        tpot = (r["e2e"] - r["ttft"]) / (n - 1) if n > 1 else 0.0
        values = {"ttft": r["ttft"], "tpot": tpot, "e2el": r["e2e"]}
        if all(slos_ms[k] / 1000 >= values[k] for k in slos_ms):
            good += 1
    return good


def test_goodput_counts_like_vllm_bench_serve() -> None:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(400):
        tokens = int(rng.integers(1, 6))
        ttft = float(rng.uniform(0.01, 0.2))
        e2e = ttft + float(rng.uniform(0.0, 0.3)) * (tokens - 1)
        rows.append(_row("a", 1.0, i, i * 0.01, ttft, e2e, tokens, ok=bool(rng.random() > 0.1)))
    rows.append(_row("a", 1.0, 999, 0.0, 0.1, 0.1, 1))  # one token: TPOT 0 always meets its SLO
    frame = pd.DataFrame(rows)
    slos = {"ttft": 120.0, "tpot": 150.0, "e2el": 600.0}
    summary = summarize(frame, slos, {"a": 4}, OPEN)
    row = summary.iloc[0]
    good = _vllm_bench_good(frame, slos)
    assert 50 < good < 350  # the SLOs split the sample; the check is not vacuous
    assert row[slo.GOODPUT_REQUESTS] * row["duration_s"] == pytest.approx(good)
    assert row["attainment"] == pytest.approx(good / len(frame))
    assert row[per_gpu(slo.GOODPUT_REQUESTS)] == pytest.approx(row[slo.GOODPUT_REQUESTS] / 4)
    assert row["failed"] == (~frame["ok"]).sum()


def test_failed_requests_are_never_good_and_count_in_attainment() -> None:
    frame = pd.DataFrame([_row("a", 2.0, 0, 0.0, 0.01, 0.05, 5),
                          _row("a", 2.0, 1, 0.0, 0.01, 0.05, 5, ok=False)])
    marked = mark_requests(frame, {"ttft": 1000.0})
    assert marked["good"].tolist() == [True, False]
    row = summarize(frame, {"ttft": 1000.0}, {"a": 1}, OPEN).iloc[0]
    assert row["attainment"] == 0.5 and row["attainment_ttft"] == 0.5
    assert row["top_error"] == "HTTP 503"
    assert row["output_tps"] == pytest.approx(5 / 0.05)


def test_itl_slo_needs_every_gap_within_it() -> None:
    frame = pd.DataFrame([_row("a", 1.0, 0, 0.0, 0.01, 0.31, 4, itl=[0.1, 0.1, 0.1]),
                          _row("a", 1.0, 1, 0.31, 0.01, 0.31, 4, itl=[0.01, 0.01, 0.28])])
    marked = mark_requests(frame, {"itl": 150.0})
    assert marked["good"].tolist() == [True, False]


def test_warmup_and_cooldown_trim_the_window() -> None:
    rows = [_row("a", 1.0, i, float(i), 0.1, 0.5, 10) for i in range(10)]  # sends 0..9, ends 0.5..9.5
    frame = pd.DataFrame(rows)
    plan = SweepPlan(mode=Mode.OPEN, levels=(1,), requests_per_level=10, warmup_s=2.0, cooldown_s=2.0)
    row = summarize(frame, {"ttft": 1000.0}, {"a": 1}, plan).iloc[0]
    # window [2, 7.5]: sends 2..7 with ends <= 7.5 -> indices 2..7
    assert row["requests"] == 6 and row["requests_sent"] == 10
    assert row["duration_s"] == pytest.approx(5.5)
    assert row["output_tps"] == pytest.approx(60 / 5.5)
    assert row["offered_rate"] == 1.0


def test_closed_loop_rates_follow_littles_law_despite_the_drain() -> None:
    # concurrency 2: lane one runs four 1 s requests, lane two two 1 s and then one 3 s request
    # (the drain: after t = 4 only one request is in flight). 7 requests x 10 tokens in 9 s busy.
    rows = [_row("a", 2.0, i, float(i), 0.1, 1.0, 10) for i in range(4)]
    rows += [_row("a", 2.0, 4, 0.0, 0.1, 1.0, 10), _row("a", 2.0, 5, 1.0, 0.1, 1.0, 10),
             _row("a", 2.0, 6, 2.0, 0.1, 3.0, 10)]
    row = summarize(pd.DataFrame(rows), {"e2el": 2000.0}, {"a": 1}).iloc[0]
    assert row["output_tps"] == pytest.approx(2 * 70 / 9)
    assert row["output_tps_window"] == pytest.approx(70 / 5)
    assert row[slo.GOODPUT_REQUESTS] == pytest.approx(2 * 6 / 9)
    assert math.isnan(row["offered_rate"])


def test_percentiles_pool_itl_over_tokens() -> None:
    frame = pd.DataFrame([_row("a", 1.0, 0, 0.0, 0.01, 1.0, 3, itl=[0.1, 0.1]),
                          _row("a", 1.0, 1, 0.0, 0.02, 1.0, 2, itl=[0.9])])
    row = summarize(frame, {"ttft": 1000.0}, {"a": 1}).iloc[0]
    assert row["itl_p50_ms"] == pytest.approx(100.0)
    assert row["ttft_mean_ms"] == pytest.approx(15.0)


def test_empty_requests_give_an_empty_summary() -> None:
    assert summarize(pd.DataFrame(), {"ttft": 1.0}, {}).empty


def test_repeats_of_a_level_pool_their_requests_over_their_summed_windows() -> None:
    from crossover.loadgen.analysis.summary import summarize_repeats

    # two measurements of one level, far apart in time (the other topology ran in between): each
    # has its own window, the rate divides by their sum, the p99 is over the pooled ITLs
    first = [_row("a", 1.0, i, float(i), 0.1, 0.5, 10) for i in range(10)]  # window 0-9.5
    second = [_row("a", 1.0, i, 100.0 + 2 * i, 0.1, 0.5, 10, itl=[0.5] * 9) for i in range(5)]  # 100-108.5
    frame = pd.DataFrame(first + second).assign(repeat=[1] * 10 + [2] * 5)
    row = summarize(frame, {"ttft": 1000.0}, {"a": 1}, OPEN).iloc[0]
    assert row["repeats"] == 2 and row["requests"] == 15
    assert row["duration_s"] == pytest.approx(9.5 + 8.5)
    assert row["output_tps"] == pytest.approx(150 / 18.0)
    assert row["itl_p99_ms"] == pytest.approx(500.0)  # a third of the pooled ITLs are 0.5 s
    each = summarize_repeats(frame, {"ttft": 1000.0}, {"a": 1}, OPEN).set_index("repeat")
    assert each.loc[1, "duration_s"] == pytest.approx(9.5) and each.loc[2, "requests"] == 5
    assert each["itl_p99_ms"].tolist()[0] < 100 < each["itl_p99_ms"].tolist()[1]
    # a table from before repeats is one measurement per level
    assert summarize(frame.drop(columns="repeat").iloc[:10], {}, {"a": 1}, OPEN).iloc[0]["repeats"] == 1


def test_a_level_whose_token_events_shared_reads_is_warned_about() -> None:
    """Stamps shared by several events of a stream (a client that fell behind) make TTFT and ITL
    the reads' times: past SHARED_READS_LIMIT of the events the level gets a warning line."""
    rows = []
    for level, shared in ((1.0, 0), (2.0, 1), (4.0, 4)):
        for index in range(4):
            row = _row("a", level, index, float(index), 0.1, 1.0, 10)
            rows.append({**row, "chunk_times": [0.1 * k for k in range(1, 11)], "chunk_tokens": [1] * 10,
                         "shared_reads": shared})
    summary = summarize(pd.DataFrame(rows), {"ttft": 1000.0}, {"a": 1}, SweepPlan(mode=Mode.CLOSED,
                                                                                  levels=(1, 2, 4)))
    assert summary["shared_read_share"].tolist() == [0.0, 0.1, 0.4]
    warned = level_warnings(summary)
    assert [line.split(":")[0] for line in warned] == ["a at 2", "a at 4"]
    assert "10% of the token events came in one socket read with another" in warned[0]
    assert "add --workers" in warned[0]


def test_records_without_shared_read_counts_have_no_share() -> None:
    """Older runs and imported `vllm bench serve` files did not count them: NaN, and no warning."""
    summary = summarize(pd.DataFrame([_row("a", 1.0, 0, 0.0, 0.1, 1.0, 10)]), {"ttft": 1000.0}, {"a": 1},
                        SweepPlan(mode=Mode.CLOSED, levels=(1,)))
    assert math.isnan(summary["shared_read_share"].iloc[0])
    assert level_warnings(summary) == []


def test_latency_columns_keep_the_names_users_read_in_results_files() -> None:
    from crossover.loadgen.analysis.crossings import DEFAULT_METRICS, METRICS
    from crossover.loadgen.analysis.serverside import server_frame

    rows = [_row("a", 1.0, i, float(i), 0.1, 0.5, 10) for i in range(10)]
    columns = set(summarize(pd.DataFrame(rows), {}, {"a": 1}, OPEN).columns)
    kinds, percentiles = ("ttft", "tpot", "itl", "e2el"), ("p50", "p90", "p99")
    assert {f"{kind}_{p}_ms" for kind in kinds for p in percentiles} <= columns
    assert [(METRICS[m].name, METRICS[m].column, METRICS[m].label) for m in DEFAULT_METRICS[2:]] == [
        ("ttft_p99", "ttft_p99_ms", "p99 TTFT"), ("tpot_p99", "tpot_p99_ms", "p99 TPOT"),
        ("itl_p99", "itl_p99_ms", "p99 ITL")]
    # LEVEL.server.json names its figures as derived_rows does: suffix{quantile}
    figures = {"ttft_seconds{0.99}": 0.25, "itl_seconds{0.99}": 0.02, "requests_waiting": 3.0}
    row = server_frame([("a", 1.0, {"figures": figures})]).iloc[0]
    assert row["server_ttft_p99_ms"] == pytest.approx(250.0)
    assert row["server_itl_p99_ms"] == pytest.approx(20.0)
    assert row["server_waiting"] == 3.0 and pd.isna(row["server_e2el_p99_ms"])
