"""Windows (Prometheus counter-reset semantics) and derivations on hand-made and real vLLM data."""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover import catalog
from crossover.exporter import state
from crossover.exporter.derive import derive, derive_rows, merge, window_rows, window_sums
from crossover.exporter.parse import ParsedSeries, Parser, SeriesKey
from crossover.exporter.quantile import bucket_fraction, histogram_quantile
from crossover.exporter.state import (
    TargetHealth,
    build_snapshot,
    slos_seconds,
    topology_figures,
    window_names,
)
from crossover.exporter.window import History, SeriesWindow, counter_increase, is_cumulative, window_of
from crossover.slo import quantile_label
from crossover.spec import FleetSpec, load_spec, spec_targets
from tests.helpers import FIXTURES, SPECS

ENGINE = (("engine", "0"), ("model_name", "m"))
INF = math.inf


def test_counter_increase_counts_a_reset_as_a_restart_from_zero():
    assert counter_increase([10, 15, 3, 7]) == 5 + 3 + 4
    assert counter_increase([5, 5]) == 0
    assert counter_increase([7]) == 0


def test_window_selects_scrapes_in_the_closed_range_and_resets():
    history = History(keep_seconds=60)
    key = (catalog.GENERATION_TOKENS.name + "_total", ENGINE)
    gauge = (catalog.NUM_REQUESTS_RUNNING.name, ENGINE)
    for t, tokens, running in [(0, 100, 1), (5, 120, 3), (10, 4, 5), (15, 14, 7)]:
        history.add(float(t), {key: float(tokens), gauge: float(running)})
    whole = history.window(15.0, 15.0)
    assert whole is not None and whole.scrapes == 4 and whole.duration == 15
    assert whole.increase[key] == 20 + 4 + 10
    assert whole.gauge_max[gauge] == 7 and whole.gauge_mean[gauge] == 4 and whole.gauge_last[gauge] == 7
    short = history.window(15.0, 5.0)
    assert short is not None and short.increase[key] == 10 and short.scrapes == 2
    assert history.window(15.0, 1.0) is None  # one scrape is no window


def test_history_forgets_what_no_window_can_hold():
    history = History(keep_seconds=10)
    key = (catalog.GENERATION_TOKENS.name + "_total", ENGINE)
    for t in range(0, 60, 5):
        history.add(float(t), {key: float(t)})
    assert [s.timestamp for s in history.scrapes] == [45.0, 50.0, 55.0]


def _same_window(a: SeriesWindow | None, b: SeriesWindow | None) -> None:
    assert (a is None) == (b is None)
    if a is None or b is None:
        return
    assert (a.start, a.end, a.scrapes, a.keys, a.complete) == (b.start, b.end, b.scrapes, b.keys, b.complete)
    for name in ("increase_values", "counted", "gauge", "last_values", "highest_values", "mean_values"):
        assert getattr(a, name).tolist() == getattr(b, name).tolist(), name


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["scrape", "scrape", "scrape", "other keys", "failed", "back"]),
                          st.floats(0, 5), st.floats(0, 3)), max_size=30))
def test_history_windows_match_the_plain_window_over_its_scrapes(steps):
    """History finds windows by bisection and keeps gauges stacked; the answer must be the plain
    filter's over the same scrapes, whatever happens: layouts change, scrapes fail, the clock steps
    back."""
    tokens = (catalog.GENERATION_TOKENS.name + "_total", ENGINE)
    running = (catalog.NUM_REQUESTS_RUNNING.name, ENGINE)
    kv = (catalog.KV_CACHE_USAGE.name, ENGINE)
    history = History(keep_seconds=20)
    now = 0.0
    for kind, grow, gauge in steps:
        now += -7.0 if kind == "back" else 5.0
        if kind == "failed":
            history.prune(now)
        elif kind == "other keys":
            history.add(now, {tokens: grow, kv: gauge / 3})
        else:
            history.add(now, {tokens: grow * now, running: gauge})
        for seconds in (5.0, 10.0, 20.0):
            _same_window(history.window(now, seconds), window_of(list(history.scrapes), now, seconds))


def test_series_that_come_and_go_use_the_scrapes_they_appear_in():
    stop = (catalog.REQUEST_SUCCESS.name + "_total", (*ENGINE, ("finished_reason", "stop")))
    length = (catalog.REQUEST_SUCCESS.name + "_total", (*ENGINE, ("finished_reason", "length")))
    history = History(keep_seconds=60)
    history.add(0.0, {stop: 1.0})
    history.add(5.0, {stop: 2.0, length: 4.0})
    history.add(10.0, {stop: 6.0, length: 5.0})
    window = history.window(10.0, 10.0)
    assert window is not None
    assert window.increase == {stop: 5.0, length: 1.0}


def _histogram(name: str, cumulative: dict[float, float], total: float) -> dict:
    series: dict[SeriesKey, float] = {}
    for bound, count in cumulative.items():
        le = "+Inf" if bound == INF else repr(bound)
        series[(name + "_bucket", (("engine", "0"), ("le", le), ("model_name", "m")))] = count
    series[(name + "_count", ENGINE)] = cumulative[INF]
    series[(name + "_sum", ENGINE)] = total
    return series


def _window(series: dict, duration: float = 10.0) -> SeriesWindow:
    """A window whose increases are the given values (as if counters started at zero)."""
    history = History(keep_seconds=duration)
    history.add(0.0, {key: 0.0 for key in series})
    history.add(duration, series)
    window = history.window(duration, duration)
    assert window is not None
    return window


def _instance(ttft: dict[float, float], tpot: dict[float, float], tokens: float, gauges: float = 1.0):
    series = {}
    series.update(_histogram(catalog.TTFT.name, ttft, total=ttft[INF] * 0.2))
    series.update(_histogram(catalog.TPOT.name, tpot, total=tpot[INF] * 0.03))
    series[(catalog.GENERATION_TOKENS.name + "_total", ENGINE)] = tokens
    series[(catalog.PROMPT_TOKENS.name + "_total", ENGINE)] = tokens * 2
    series[(catalog.REQUEST_SUCCESS.name + "_total", (*ENGINE, ("finished_reason", "stop")))] = ttft[INF]
    series[(catalog.NUM_PREEMPTIONS.name + "_total", ENGINE)] = 0.0
    return _window(series), gauges


TTFT_A = {0.1: 4.0, 0.5: 8.0, 2.5: 10.0, INF: 10.0}
TTFT_B = {0.1: 0.0, 0.5: 2.0, 2.5: 9.0, INF: 10.0}
TPOT_A = {0.025: 5.0, 0.05: 9.0, 0.1: 10.0, INF: 10.0}
TPOT_B = {0.025: 1.0, 0.05: 6.0, 0.1: 10.0, INF: 10.0}


def test_group_sums_buckets_before_taking_quantiles_and_ratios():
    (a, _), (b, _) = _instance(TTFT_A, TPOT_A, 1000), _instance(TTFT_B, TPOT_B, 500)
    derived = derive([a, b], gpus=4, slos_seconds={"ttft": 0.5, "tpot": 0.05}, window_seconds=60)
    summed = [(0.1, 4.0), (0.5, 10.0), (2.5, 19.0), (INF, 20.0)]
    assert derived.latency["ttft"].quantiles["0.99"] == histogram_quantile(0.99, summed)
    assert derived.latency["ttft"].quantiles["0.5"] == histogram_quantile(0.5, summed)
    assert derived.latency["ttft"].mean == pytest.approx(0.2)
    assert derived.latency["ttft"].observations == 20
    assert derived.attainment["ttft"].ratio == pytest.approx(10 / 20) and derived.attainment["ttft"].exact
    assert derived.attainment["tpot"].ratio == pytest.approx(15 / 20) and derived.attainment["tpot"].exact
    assert derived.joint_slos == ("ttft", "tpot")
    assert derived.attainment_lower == pytest.approx(0.25)
    assert derived.attainment_upper == pytest.approx(0.5)
    assert derived.generation_tokens_per_second == pytest.approx(150.0)
    assert derived.generation_tokens_per_second_per_gpu == pytest.approx(37.5)
    assert derived.prompt_tokens_per_second == pytest.approx(300.0)
    assert derived.requests_per_second == pytest.approx(2.0)
    assert derived.requests_per_second_by_reason == {"stop": pytest.approx(2.0)}
    assert derived.goodput_tokens_per_second_lower == pytest.approx(150 * 0.25)
    assert derived.goodput_tokens_per_second_upper == pytest.approx(150 * 0.5)
    assert derived.preemptions_per_second == 0.0
    assert derived.targets == 2 and type(derived.targets) is int
    assert type(derived.generation_tokens_per_second) is float  # plain floats, not numpy's, in every Derived


def test_preemptions_per_request_is_the_groups_sum_over_its_count():
    """Instance a finished 10 requests preempted 3 times in all, b 30 requests preempted 1 time:
    4 preemptions over 40 requests (not the mean of 0.3 and 0.033)."""
    windows = []
    for preemptions, total in (({1.0: 8.0, 2.0: 9.0, 20.0: 10.0, INF: 10.0}, 3.0),
                               ({1.0: 30.0, 2.0: 30.0, 20.0: 30.0, INF: 30.0}, 1.0)):
        series = dict(_instance(TTFT_A, TPOT_A, 100)[0].increase)
        series.update(_histogram(catalog.REQUEST_NUM_PREEMPTIONS.name, preemptions, total))
        windows.append(_window(series))
    derived = derive(windows, gpus=2, slos_seconds={"ttft": 0.5}, window_seconds=60)
    assert derived.preemptions_per_request == pytest.approx(4 / 40)
    idle = _histogram(catalog.REQUEST_NUM_PREEMPTIONS.name, {1.0: 0.0, INF: 0.0}, 0.0)
    quiet = derive([_window(idle)], gpus=1, slos_seconds={}, window_seconds=60)
    assert quiet.preemptions_per_request is not None and math.isnan(quiet.preemptions_per_request)
    # A vLLM that does not serve the family gives no figure rather than zero.
    assert derive([_instance(TTFT_A, TPOT_A, 100)[0]], gpus=1, slos_seconds={},
                  window_seconds=60).preemptions_per_request is None


def _failing(ttft: dict[float, float], tpot: dict[float, float], errors: float, cut: float, rejected: float,
             bad_input: float) -> SeriesWindow:
    """An instance that served ttft[INF] requests and failed others as vLLM 0.32 counts them: engine
    errors (finished_reason error, observed by TPOT at 0 s, 5xx), cut streams (2xx only),
    admission rejections (5xx and the admission counter); bad input is a 4xx counted nowhere."""
    series = dict(_instance(ttft, {**{b: c + errors for b, c in tpot.items()}}, 1000)[0].increase)
    # _instance's TPOT now holds the errors' observations too (all in the first bucket).
    series[(catalog.REQUEST_SUCCESS.name + "_total", (*ENGINE, ("finished_reason", "error")))] = errors
    queue_limit = (("model_name", "m"), ("reason", "max_num_queued_reqs"))
    series[(catalog.ADMISSION_REJECTIONS.name + "_total", queue_limit)] = rejected
    for status, count in (("2xx", ttft[INF] + cut), ("4xx", bad_input), ("5xx", errors + rejected)):
        key = (("handler", "/v1/completions"), ("method", "POST"), ("status", status))
        series[(catalog.HTTP_REQUESTS.name + "_total", key)] = count
    models = (("handler", "/v1/models"), ("method", "GET"), ("status", "2xx"))
    series[(catalog.HTTP_REQUESTS.name + "_total", models)] = 50.0
    return _window(series)


def test_failed_requests_count_as_not_good():
    """10 served (TTFT_A: 8 within 0.5 s; TPOT_A: 9 within 0.05 s), 4 errors, 3 cut streams, 3
    rejections and 7 bad requests: 20 requests the fleet should have served."""
    window = _failing(TTFT_A, TPOT_A, errors=4, cut=3, rejected=3, bad_input=7)
    derived = derive([window], gpus=1, slos_seconds={"ttft": 0.5, "tpot": 0.05}, window_seconds=10)
    assert derived.failures_counted is True
    per_s = 1 / 10
    assert derived.failed_requests_per_second == pytest.approx(
        {"error": 4 * per_s, "rejected": 3 * per_s, "unfinished": 3 * per_s})
    # TTFT observed served requests only: 8/10 within, x 10 served of 20.
    assert derived.attainment["ttft"].ratio == pytest.approx(8 / 20)
    # TPOT observed the 4 errors at 0 s: (9 + 4 within) - 4 failed, of 20.
    assert derived.attainment["tpot"].ratio == pytest.approx(9 / 20)
    assert derived.attainment_upper == pytest.approx(8 / 20)
    assert derived.goodput_requests_per_second_upper == pytest.approx(20 * per_s * 8 / 20)


def test_a_fleet_failing_every_request_attains_nothing():
    nothing = {0.1: 0.0, 0.5: 0.0, 2.5: 0.0, INF: 0.0}
    window = _failing(nothing, {0.025: 0.0, 0.05: 0.0, 0.1: 0.0, INF: 0.0}, errors=5, cut=0, rejected=5,
                      bad_input=0)
    derived = derive([window], gpus=1, slos_seconds={"ttft": 0.5, "tpot": 0.05}, window_seconds=10)
    assert derived.attainment["ttft"].ratio == 0.0 and derived.attainment["tpot"].ratio == 0.0
    assert derived.goodput_requests_per_second_lower == 0.0


def test_without_failure_families_attainment_is_the_histogram_share_and_says_so():
    """An older vLLM: no finished_reason, no admission or HTTP counter."""
    series = dict(_instance(TTFT_A, TPOT_A, 1000)[0].increase)
    success = {k: v for k, v in series.items() if k[0] == catalog.REQUEST_SUCCESS.name + "_total"}
    for key, value in success.items():
        del series[key]
        series[(key[0], ENGINE)] = value
    derived = derive([_window(series)], gpus=1, slos_seconds={"ttft": 0.5}, window_seconds=10)
    assert derived.failures_counted is False
    assert derived.attainment["ttft"].ratio == pytest.approx(8 / 10)
    assert derived.failed_requests_per_second == {}


def test_threshold_off_a_boundary_is_interpolated_and_marked():
    (a, _) = _instance(TTFT_A, TPOT_A, 1000)
    derived = derive([a], gpus=1, slos_seconds={"ttft": 2.0, "itl": 0.05}, window_seconds=60)
    assert not derived.attainment["ttft"].exact
    assert derived.attainment["ttft"].ratio == pytest.approx((8 + 2 * (1.5 / 2.0)) / 10)
    assert "itl" not in derived.attainment  # no ITL histogram exposed: absent, not zero
    assert "itl" not in derived.latency
    assert derived.joint_slos == ("ttft",)


def test_absent_families_are_none_never_zero():
    (a, _) = _instance(TTFT_A, TPOT_A, 1000)
    derived = derive([a], gpus=1, slos_seconds={"ttft": 0.5}, window_seconds=60)
    assert derived.kv_cache_usage_max is None and derived.running is None and derived.waiting is None
    assert derived.kv_transfer is None
    empty = derive([None, None], gpus=2, slos_seconds={"ttft": 0.5}, window_seconds=60)
    assert empty.targets == 0 and empty.latency == {} and empty.generation_tokens_per_second is None
    assert empty.attainment_lower is None


def test_no_observations_give_nan_quantiles_and_ratios_and_zero_rates():
    zero = {0.1: 0.0, 0.5: 0.0, INF: 0.0}
    (a, _) = _instance(zero, zero, 0)
    derived = derive([a], gpus=1, slos_seconds={"ttft": 0.5, "tpot": 0.1}, window_seconds=60)
    assert math.isnan(derived.latency["ttft"].quantiles["0.5"])
    assert math.isnan(derived.latency["ttft"].mean)
    assert math.isnan(derived.attainment["ttft"].ratio)
    assert derived.attainment_lower is not None and math.isnan(derived.attainment_lower)
    assert derived.generation_tokens_per_second == 0.0


def test_gauges_mean_and_max_over_the_window_and_targets():
    kv = (catalog.KV_CACHE_USAGE.name, ENGINE)
    running = (catalog.NUM_REQUESTS_RUNNING.name, ENGINE)
    histories = []
    for samples in ([(0.1, 2), (0.3, 4)], [(0.5, 1), (0.9, 1)]):
        history = History(keep_seconds=10)
        for t, (usage, run) in zip((0.0, 10.0), samples, strict=True):
            history.add(t, {kv: usage, running: float(run)})
        histories.append(history.window(10.0, 10.0))
    derived = derive(histories, gpus=2, slos_seconds={"ttft": 0.5}, window_seconds=10)
    assert derived.kv_cache_usage_max == 0.9
    assert derived.kv_cache_usage_mean == pytest.approx((0.2 + 0.7) / 2)
    assert derived.running == pytest.approx(3 + 1)


def test_kv_transfer_from_the_nixl_families():
    series = _histogram(catalog.NIXL_XFER_TIME.name, {0.01: 2.0, 0.1: 10.0, INF: 10.0}, total=0.4)
    series.update(_histogram(catalog.NIXL_BYTES.name, {2.0**21: 4.0, 2.0**23: 10.0, INF: 10.0}, total=4e7))
    series[(catalog.NIXL_FAILED_TRANSFERS.name + "_total", ENGINE)] = 1.0
    derived = derive([_window(series)], gpus=1, slos_seconds={"ttft": 0.5}, window_seconds=10)
    kv = derived.kv_transfer
    assert kv is not None and kv.time is not None
    assert kv.time.quantiles["0.5"] == histogram_quantile(0.5, [(0.01, 2), (0.1, 10), (INF, 10)])
    assert kv.time.mean == pytest.approx(0.04)
    assert kv.transfers_per_second == pytest.approx(1.0)
    assert kv.bytes_per_second == pytest.approx(4e6)
    assert kv.bytes_per_transfer_second == pytest.approx(1e8)
    assert kv.failures_per_second == pytest.approx(0.1)


def test_buckets_of_different_layouts_are_summed_by_le():
    """A target started with other buckets: the group's buckets are the union of the bounds, each
    summing the targets that have it, as PromQL's sum by (le) does."""
    a = _window(_histogram(catalog.TTFT.name, {0.1: 2.0, 0.5: 6.0, INF: 8.0}, total=2.0))
    b = _window(_histogram(catalog.TTFT.name, {0.1: 1.0, 1.0: 3.0, INF: 4.0}, total=1.0))
    derived = derive([a, b], gpus=2, slos_seconds={"ttft": 1.0}, window_seconds=10)
    summed = [(0.1, 3.0), (0.5, 6.0), (1.0, 3.0), (INF, 12.0)]
    for q, label in ((0.5, "0.5"), (0.9, "0.9"), (0.99, "0.99")):
        assert derived.latency["ttft"].quantiles[label] == histogram_quantile(q, summed), q
    assert derived.latency["ttft"].observations == 12.0 and derived.latency["ttft"].mean == 3.0 / 12.0
    fraction = bucket_fraction(1.0, summed, 12.0)
    assert derived.attainment["ttft"].ratio == fraction.value and derived.attainment["ttft"].exact


_BOUNDS = (0.001, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 10.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 50), min_size=len(_BOUNDS) + 1, max_size=len(_BOUNDS) + 1),
                          st.booleans()), min_size=1, max_size=6),
       st.lists(st.sampled_from(_BOUNDS), min_size=2, max_size=len(_BOUNDS), unique=True),
       st.one_of(st.sampled_from(_BOUNDS), st.floats(0.0005, 20.0)))
def test_rows_give_prometheus_histogram_quantile_and_bucket_fraction(rows, bounds, threshold):
    """Several targets reduced and derived at once: each row's quantiles, mean and SLO share are
    what quantile.py (Prometheus's histogram_quantile, checked against a real Prometheus in
    test_exporter_prometheus.py) computes from that row's buckets alone; buckets out of order (a
    lower bound counting more) and rows without observations included."""
    kept = sorted(bounds)
    windows, expected = [], []
    for per_bucket, out_of_order in rows:
        cumulative = dict(zip((*kept, INF), itertools.accumulate(per_bucket), strict=False))
        cumulative[INF] = sum(per_bucket)
        if out_of_order and len(kept) > 1:
            cumulative[kept[0]] = cumulative[kept[1]] + 3.0
        windows.append(_window(_histogram(catalog.TTFT.name, cumulative, total=0.3 * cumulative[INF])))
        expected.append(sorted(cumulative.items()))
    assert all(w.keys is windows[0].keys for w in windows)  # one layout: reduced as one batch
    derived = derive_rows(window_rows(windows), [1] * len(windows), slos_seconds={"ttft": threshold},
                          window_seconds=10)
    for figures, buckets in zip(derived, expected, strict=True):
        latency = figures.latency["ttft"]
        for q in (0.5, 0.9, 0.99):
            assert _plain(latency.quantiles[quantile_label(q)]) == _plain(histogram_quantile(q, buckets))
        count = buckets[-1][1]
        assert _plain(latency.mean) == _plain(0.3 * count / count if count else math.nan)
        fraction = bucket_fraction(threshold, buckets, count)
        attainment = figures.attainment["ttft"]  # no finished_reason: the histogram's share alone
        assert (_plain(attainment.ratio), attainment.exact) == (_plain(fraction.value), fraction.exact)


def test_a_row_is_derived_as_it_would_be_alone():
    """A target's figures do not depend on the targets derived beside it, NaN and infinite values
    included (each is a row: nothing is reduced across rows)."""
    payloads = _real_payloads()
    windows = []
    for index in range(4):
        history = History(keep_seconds=60)
        for step, base in enumerate(payloads):
            values = [v * (step + 1) * (index + 1) if is_cumulative(k[0]) else v
                      for k, v in zip(base.keys, base.values, strict=True)]
            if index == 1 and step == 2:  # NaN buckets and a NaN gauge
                nan = (catalog.TTFT.name + "_bucket", catalog.KV_CACHE_USAGE.name)
                values = [math.nan if k[0] in nan else v for k, v in zip(base.keys, values, strict=True)]
            if index == 2 and step == 2:  # an infinite counter
                values = [INF if k[0] == catalog.GENERATION_TOKENS.name + "_total" else v
                          for k, v in zip(base.keys, values, strict=True)]
            history.add(step * 5.0, ParsedSeries(base.keys, values))
        window = history.window(10.0, 60.0)
        assert window is not None and window.complete
        windows.append(window)
    slos = {"ttft": 0.5, "tpot": 0.05, "itl": 0.05}
    together = derive_rows(window_rows(windows), [1, 2, 3, 4], slos_seconds=slos, window_seconds=60)
    alone = [derive([w], gpus=i + 1, slos_seconds=slos, window_seconds=60) for i, w in enumerate(windows)]
    assert _plain(together) == _plain(alone)
    assert math.isnan(together[1].latency["ttft"].quantiles["0.5"])
    assert together[1].kv_cache_usage_max is not None and math.isnan(together[1].kv_cache_usage_max)
    assert together[2].generation_tokens_per_second == INF
    assert all(math.isfinite(v) for v in together[0].latency["ttft"].quantiles.values())


def _real_window() -> SeriesWindow:
    parser = Parser()
    history = History(keep_seconds=60)
    for t, name in enumerate(("idle", "under-load", "after-requests")):
        history.add(t * 5.0, parser.series((FIXTURES / f"vllm-0.32.0-{name}.prom").read_text()))
    window = window_of(list(history.scrapes), 10.0, 60.0)
    assert window is not None
    return window


def test_real_vllm_payloads_give_every_colocated_series_finite():
    derived = derive([_real_window()], gpus=2, slos_seconds={"ttft": 0.5, "tpot": 0.05, "itl": 0.05},
                     window_seconds=60)
    for short in ("ttft", "tpot", "itl", "e2el"):
        latency = derived.latency[short]
        assert latency.observations > 0
        assert all(math.isfinite(v) and v > 0 for v in latency.quantiles.values()), short
        assert math.isfinite(latency.mean)
    scalars = [derived.prompt_tokens_per_second, derived.generation_tokens_per_second,
               derived.requests_per_second, derived.kv_cache_usage_max, derived.kv_cache_usage_mean,
               derived.running, derived.waiting, derived.preemptions_per_second,
               derived.attainment_lower, derived.attainment_upper,
               derived.goodput_tokens_per_second_lower, derived.goodput_tokens_per_second_upper,
               derived.generation_tokens_per_second_per_gpu]
    assert all(v is not None and math.isfinite(v) for v in scalars), scalars
    assert derived.generation_tokens_per_second is not None and derived.generation_tokens_per_second > 0
    assert set(derived.attainment) == {"ttft", "tpot", "itl"}
    assert all(0 <= g.ratio <= 1 for g in derived.attainment.values())
    assert derived.requests_per_second_by_reason["length"] > 0
    assert derived.kv_transfer is None  # a colocated server exposes no NIXL families
    # vLLM 0.32.0 serves catalog.REQUEST_NUM_PREEMPTIONS: its requests were never preempted.
    assert derived.preemptions_per_request == 0.0


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=2, max_size=30),
       st.integers(min_value=1, max_value=30))
def test_window_increase_equals_prometheus_reset_semantics(values, span):
    key = (catalog.GENERATION_TOKENS.name + "_total", ENGINE)
    history = History(keep_seconds=1000)
    for t, value in enumerate(values):
        history.add(float(t), {key: float(value)})
    end = float(len(values) - 1)
    window = history.window(end, float(span))
    chosen = values[max(0, len(values) - 1 - span):]
    if len(chosen) < 2:
        assert window is None
    else:
        assert window is not None and window.increase[key] == counter_increase([float(v) for v in chosen])


# --- many rows at once against one target or group at a time, and against quantile.py ------------------
def _plain(value: object) -> object:
    """Derived as nested plain data, NaN comparable."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return value


def _real_payloads() -> list[ParsedSeries]:
    """A real vLLM's /metrics idle, under load and after requests."""
    parser = Parser()
    return [parser.parse((FIXTURES / f"vllm-0.32.0-{n}.prom").read_text())
            for n in ("idle", "under-load", "after-requests")]


_NIXL = {**_histogram(catalog.NIXL_XFER_TIME.name, {0.01: 2.0, 0.1: 9.0, INF: 10.0}, total=0.4),
         **_histogram(catalog.NIXL_BYTES.name, {2.0**21: 4.0, 2.0**23: 10.0, INF: 10.0}, total=4e7),
         (catalog.NIXL_FAILED_TRANSFERS.name + "_total", ENGINE): 1.0}


def _fleet_histories(seed: int) -> tuple[FleetSpec, list[TargetHealth], float]:
    """Two topologies of real vLLM payloads with per-target and per-series scaling (buckets out of
    order, ranks in the +Inf bucket), a reset, a target with a short history, one with its own
    layout (a missing finished_reason) and four with NIXL families (a layout of their own, with the
    KV-transfer figures); twelve targets a topology so that the order of sums shows."""
    rng = random.Random(seed)
    spec = load_spec(SPECS / "seed-70b-h100.yaml").model_dump(mode="json")
    spec["topologies"] = [
        {"name": f"t{t}", "gpus": 48, "tensor_parallel_size": 4,
         "instances": [{"name": f"i{t}-{i}", "url": f"http://127.0.0.1:1/{t}-{i}"} for i in range(12)]}
        for t in range(2)]
    spec["scrape"].update({"interval": "5s", "timeout": "5s", "windows": ["30s", "1m"]})
    fleet = FleetSpec.model_validate(spec)
    payloads = _real_payloads()
    health = [TargetHealth(t, History(70.0)) for t in spec_targets(fleet)]
    for index, record in enumerate(health):
        scale = rng.uniform(0.5, 3.0) * 10.0 ** rng.randint(-3, 3)
        factors = [rng.choice([1.0, 1.0, rng.uniform(0.3, 3.0)]) for _ in payloads[0].keys]
        for step in range(12 if index != 3 else 1):
            base = payloads[min(step // 4, 2)]
            grow = (step + 1) * scale
            reset = index == 5 and step == 7
            values = [v * grow * f * (0.1 if reset else 1.0) if is_cumulative(k[0]) else v * rng.uniform(0, 2)
                      for k, v, f in zip(base.keys, base.values, factors, strict=True)]
            keys = base.keys
            if index == 6:  # its own layout: one finished_reason series fewer
                keep = [i for i, k in enumerate(keys) if dict(k[1]).get("finished_reason") != "abort"]
                keys, values = tuple(keys[i] for i in keep), [values[i] for i in keep]
            if index >= 20:
                keys, values = (*keys, *_NIXL), [*values, *(v * grow for v in _NIXL.values())]
            record.history.add(step * 5.0, ParsedSeries(keys, values))
    return fleet, health, 55.0


@pytest.mark.parametrize("seed", range(4))
def test_batched_derivation_gives_the_per_target_numbers_exactly(seed):
    """The snapshot reduces targets of one layout together, sums groups from their rows and derives
    groups of one shape together; each figure must be what deriving the group's windows on their
    own gives. The arithmetic is one (derive_rows), so this checks the grouping: which rows go
    into which figure, in which order."""
    spec, health, now = _fleet_histories(seed)
    snapshot = build_snapshot(spec, health, now)
    slos = slos_seconds(spec)
    windows = {name: {r.target.key: r.history.window(now, seconds) for r in health}
               for name, seconds in window_names(spec).items()}
    seconds = window_names(spec)
    batched = 0
    for view in (*snapshot.topologies, *snapshot.instances):
        members = [r.target for r in health if r.target.topology == view.topology
                   and (view.instance is None or r.target.instance == view.instance)]
        for name, derived in view.windows.items():
            expected = derive([windows[name][t.key] for t in members], gpus=view.gpus, slos_seconds=slos,
                              window_seconds=seconds[name])
            if view.instance is None:  # a colocated topology's requests come from its instances
                expected = dataclasses.replace(expected, requests_source="instances")
            assert _plain(derived) == _plain(expected), (view.topology, view.instance, name)
            assert (derived.kv_transfer is not None) == (view.topology == "t1" and view.instance in (
                None, "i1-8", "i1-9", "i1-10", "i1-11"))
            batched += 1
    assert batched == 2 * (2 + 24)


def _pd_histories() -> tuple[FleetSpec, list[TargetHealth], float]:
    """One P/D topology, two prefill and two decode instances behind an entrypoint, each target
    scraped twelve times from real vLLM payloads at its own scale."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    pd = next(t for t in data["topologies"] if t["name"] == "pd1p1d")
    pd.update(name="pd2p2d", gpus=4, instances=[
        {"name": f"{role}-{i}", "url": f"http://127.0.0.1:1/{role}-{i}", "role": role}
        for role in ("prefill", "decode") for i in range(2)])
    data["topologies"] = [pd]
    spec = FleetSpec.model_validate(data)
    payloads = _real_payloads()
    health = [TargetHealth(t, History(400.0)) for t in spec_targets(spec)]
    for index, record in enumerate(health):
        for step in range(12):
            base = payloads[min(step // 4, 2)]
            grow = (step + 1) * (index + 1)
            record.history.add(step * 5.0, ParsedSeries(base.keys, [
                v * grow if is_cumulative(k[0]) else v for k, v in zip(base.keys, base.values, strict=True)]))
    return spec, health, 55.0


def test_a_pd_topology_merges_each_role_once_per_window(monkeypatch):
    """The topology's figures and its role rows read the same role sums: entrypoint, prefill,
    decode and all instances are merged once per window, and the figures are those of merging
    each group afresh."""
    spec, health, now = _pd_histories()
    merges: list[int] = []
    merge_rows = state.merge_rows

    def counted(picks):
        merges.append(len(picks))
        return merge_rows(picks)

    monkeypatch.setattr(state, "merge_rows", counted)
    snapshot = build_snapshot(spec, health, now)
    windows = window_names(spec)
    assert len(merges) == 4 * len(windows)
    assert {r.role for r in snapshot.roles} == {"entrypoint", "prefill", "decode"}

    slos = slos_seconds(spec)
    targets = [r.target for r in health]
    for name, seconds in windows.items():
        by_key = {r.target.key: r.history.window(now, seconds) for r in health}

        def afresh(members, by_key=by_key):
            return merge(window_sums(w) for t in members if (w := by_key[t.key]) is not None)

        for view in snapshot.roles:
            members = [t for t in targets if t.role == view.role]
            expected = derive([by_key[t.key] for t in members], gpus=view.gpus, slos_seconds=slos,
                              window_seconds=seconds)
            assert _plain(view.windows[name]) == _plain(expected), (view.role, name)
        (topology,) = snapshot.topologies
        expected, _ = topology_figures(targets, afresh, gpus=topology.gpus, slos_seconds=slos,
                                       window_seconds=seconds)
        assert expected.requests_source == "entrypoint"
        assert _plain(topology.windows[name]) == _plain(expected), name
