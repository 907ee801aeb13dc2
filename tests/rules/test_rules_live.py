"""Live: a real Prometheus scrapes the simulated P/D fleet with the generated config and rules.

After a burst of traffic every recording rule has data, no fleet alert fires, and the recorded
values equal an independent derivation in Python from the raw samples Prometheus stored for the
same window at the same evaluation time: each series' rate as Prometheus 2.x computes it
(extrapolatedRate), summed per topology, then divided or interpolated (never averaged ratios).
Tolerance 1e-9 relative: only the order of float additions differs. (Evaluations that ran before
a late scrape was stored are skipped, see `_recorded`.)
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict

import pytest

from crossover import catalog, slo
from crossover.rules.names import (
    GPUS_NAME,
    KV_BYTES,
    KV_FAILURES,
    KV_TIME,
    Stemmed,
    attainment_name,
    goodput_tokens_name,
    histogram_rate_name,
    joint_attainment_name,
    kv_bandwidth_name,
    kv_usage_name,
    mean_name,
    per_gpu_name,
    quantile_name,
    rate_name,
    requests_name,
    requests_source_name,
)
from crossover.rules.recording import RecordingRule
from crossover.spec import parse_duration
from tests.helpers import require
from tests.rules.live_stack import LiveStack, live_stack

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
SPEC = "pd-8k-prompts.yaml"
REL = 1e-9
NEVER_WITH_HEALTHY_FLEET = ("VllmTargetDown", "VllmTopologyDown", "VllmTopologyAbsent", "VllmMetricsAbsent",
                            "VllmSloBucketMissing", "VllmKvTransferFailures")


@pytest.fixture(scope="module")
def stack() -> LiveStack:
    stack = live_stack(SPEC)
    stack.fresh_traffic()
    rate = rate_name(catalog.GENERATION_TOKENS, "1m")
    topologies = {t.name for t in stack.spec.topologies}
    stack.prometheus.wait_until(
        lambda: {s.labels["topology"] for s in stack.prometheus.query(f"{rate} > 0")} == topologies,
        60, f"{rate} > 0 for every topology")
    stack.wait_for_every_group()
    return stack


def test_traffic_reached_every_topology(stack: LiveStack) -> None:
    assert all(count >= 2 for count in stack.requests_done.values()), stack.requests_done


def test_every_rule_evaluates_without_error(stack: LiveStack) -> None:
    health = stack.prometheus.rule_health()
    bad = {name: state for name, state in health.items() if not state.startswith("ok")}
    assert not bad, bad
    assert set(health) >= stack.rules.record_names


def test_every_recording_rule_has_data(stack: LiveStack) -> None:
    empty = [name for name in sorted(stack.rules.record_names) if not stack.prometheus.query(name)]
    assert not empty, f"recording rules without data after traffic: {empty}"


def test_per_topology_series_for_every_topology(stack: LiveStack) -> None:
    for name in (rate_name(catalog.GENERATION_TOKENS, "1m"), attainment_name("tpot", "1m"),
                 quantile_name(catalog.ITL, 0.99, "1m"), kv_usage_name("max")):
        got = {s.labels["topology"] for s in stack.prometheus.query(name)}
        assert got == {t.name for t in stack.spec.topologies}, name
    kv = {s.labels["topology"] for s in stack.prometheus.query(kv_bandwidth_name("1m"))}
    assert kv == {"pd1p1d"}
    sources = {s.labels["topology"]: s.labels["source"]
               for s in stack.prometheus.query(requests_source_name())}
    assert sources == {"colocated": "instances", "pd1p1d": "entrypoint"}


def test_no_fleet_alert_with_a_healthy_fleet(stack: LiveStack) -> None:
    noisy = [a for a in stack.prometheus.alerts() if a["labels"]["alertname"] in NEVER_WITH_HEALTHY_FLEET]
    assert not noisy, noisy


# ---- the independent derivation --------------------------------------------------------------

def prometheus_rate(values: list[tuple[float, float]], at: float, window_s: float) -> float | None:
    """Prometheus 2.x extrapolatedRate for a counter, on (unix seconds, value) samples."""
    if len(values) < 2:
        return None
    points = [(round(t * 1000), v) for t, v in values]
    range_end = round(at * 1000)
    range_start = range_end - round(window_s * 1000)
    result = points[-1][1] - points[0][1]
    last = 0.0
    for _, value in points:
        if value < last:
            result += last
        last = value
    to_start = (points[0][0] - range_start) / 1000
    to_end = (range_end - points[-1][0]) / 1000
    sampled = (points[-1][0] - points[0][0]) / 1000
    average = sampled / (len(points) - 1)
    if result > 0 and points[0][1] >= 0:
        to_start = min(to_start, sampled * (points[0][1] / result))
    threshold = average * 1.1
    interval = sampled
    interval += to_start if to_start < threshold else average / 2
    interval += to_end if to_end < threshold else average / 2
    return result * (interval / sampled) / window_s


def _rates(stack: LiveStack, series: str, at: float, window: str,
           by: tuple[str, ...] = ("topology",)) -> dict[tuple[str, ...], float]:
    """sum by (by) (rate(series[window])) computed here from the raw samples."""
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, values in stack.prometheus.query_range_vector(f"{series}[{window}]", at):
        rate = prometheus_rate(values, at, parse_duration(window))
        if rate is not None:
            out[tuple(labels.get(k, "") for k in by)] += rate
    return dict(out)


def _user_rates(stack: LiveStack, series: str, at: float, window: str,
                by: tuple[str, ...] = ("topology",)) -> dict[tuple[str, ...], float]:
    """_rates of a request family as the rules pick it per topology (docs/routers.md): from the
    entrypoint role where the topology has one, else its decode role, else all its targets."""
    by_role = _rates(stack, series, at, window, ("role", *by))
    roles: dict[str, set[str]] = defaultdict(set)
    for role, topology, *_ in by_role:
        roles[topology].add(role)
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for (role, *key), rate in by_role.items():
        present = roles[key[0]]
        chosen = next(({r} for r in ("entrypoint", "decode") if r in present), present)
        if role in chosen:
            out[tuple(key)] += rate
    return dict(out)


def _quantile(q: float, buckets: dict[float, float]) -> float:
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    rank = q * total
    for index, bound in enumerate(bounds):
        if buckets[bound] >= rank:
            if math.isinf(bound):
                return bounds[-2]
            low = bounds[index - 1] if index else 0.0
            below = buckets[low] if index else 0.0
            return low + (bound - low) * (rank - below) / (buckets[bound] - below)
    return math.nan


def _expanded(stack: LiveStack, name: str) -> str:
    """The rule's expression with every recording rule it reads replaced by that rule's expression,
    down to raw series (the spec-constant GPU counts and recordings read with matchers or over a
    range stay)."""
    exprs: dict[str, list[str]] = defaultdict(list)
    for rule in stack.rules.records:
        exprs[rule.record].append(rule.expr)
    unique = {k: v[0] for k, v in exprs.items() if len(v) == 1 and k != GPUS_NAME}
    # A recording read with label matchers (`...:rate1m{le=~"..."}`) or over a range (`[5m]`) stays:
    # its group recorded it at the same evaluation.
    pattern = re.compile(r"(?<![\w:])(" + "|".join(re.escape(k) for k in unique) + r")(?![\w:{\[])")
    text = unique[name]
    while True:
        expanded = pattern.sub(lambda match: f"({unique[match.group(1)]})", text)
        if expanded == text:
            return text
        text = expanded


# A 1m window holds a burst's data until about 55 s after it ended (measured): a burst at most this
# old fills every evaluation of the last HISTORY.
RECENT_S = 20.0
HISTORY = "45s"


def _fresh(stack: LiveStack, max_age_s: float = RECENT_S) -> None:
    """Serve another burst when the last one is too old for the recent evaluations to hold it (the
    tests before may have taken minutes on a loaded machine), then let every 1m group evaluate."""
    before = stack.traffic_ended
    stack.fresh_traffic(max_age_s=max_age_s)
    if stack.traffic_ended != before:
        time.sleep(_window_groups_interval(stack) + 2 * stack.spec.scrape.interval_seconds)


def _window_groups_interval(stack: LiveStack, window: str = "1m") -> float:
    """The longest evaluation interval among the groups that record `window` rules."""
    return max(g.interval_s or stack.spec.scrape.interval_seconds for g in stack.rules.groups
               if any(isinstance(r, RecordingRule) and r.record.endswith(window) for r in g.rules))


def _recorded(stack: LiveStack, name: str) -> tuple[float, dict[str, float]]:
    """A recent evaluation of a recording rule and its value per topology: the latest one whose
    value equals its expression (expanded to raw series) re-evaluated now at the same timestamp.
    On a loaded machine a scrape can land after an evaluation that its timestamp precedes; such an
    evaluation saw fewer samples than a query does later, so it is skipped, never tolerated. A
    15-s group has three evaluations in HISTORY, and a loaded machine can delay a scrape past each:
    then one more burst gives three more."""
    expr = _expanded(stack, name)
    for max_age_s in (RECENT_S, 0.0):
        _fresh(stack, max_age_s)
        history: dict[float, dict[str, float]] = defaultdict(dict)
        for labels, values in stack.prometheus.query_range_vector(f"{name}[{HISTORY}]", time.time()):
            for at, value in values:
                history[at][labels["topology"]] = value
        for at in sorted(history, reverse=True)[:20]:
            evaluated = {s.labels["topology"]: s.value for s in stack.prometheus.query(expr, at)}
            recorded = history[at]
            if evaluated.keys() == recorded.keys() and all(
                    _close(recorded[t], evaluated[t], REL) for t in recorded):
                return at, recorded
    pytest.fail(f"no evaluation of {name} in the last {HISTORY} of two bursts equals its expression "
                f"re-evaluated")


def _close(got: float, want: float, rel: float) -> bool:
    return math.isclose(got, want, rel_tol=rel, abs_tol=1e-9)


def test_rates_and_goodput_match_the_python_derivation(stack: LiveStack) -> None:
    sel = stack.rules.config.selector
    window = "1m"
    name = rate_name(catalog.GENERATION_TOKENS, window)
    at, recorded = _recorded(stack, name)
    # generated tokens leave out the prefill role (one token per request, no output)
    tokens = f'{catalog.GENERATION_TOKENS.promql_name}{{{sel},role!~"entrypoint|prefill"}}'
    derived = _rates(stack, tokens, at, window)
    for topology, value in recorded.items():
        assert value > 0 and _close(value, derived[(topology,)], REL), (topology, value, derived)
    for bucket in stack.rules.slo_buckets:
        at, recorded = _recorded(stack, attainment_name(bucket.slo, window))
        good = _user_rates(stack, f"{bucket.metric.name}_bucket{{{sel},{bucket.le_matcher}}}", at, window)
        every = _user_rates(stack, f"{bucket.metric.name}_count{{{sel}}}", at, window)
        for topology, value in recorded.items():
            within = good[(topology,)] / every[(topology,)]
            outcomes = _outcomes(stack, topology, at, window)
            want = slo.attainment(bucket.slo, within, every[(topology,)], outcomes)
            assert _close(value, want, REL), (bucket.slo, topology, value, want)


def _outcomes(stack: LiveStack, topology: str, at: float, window: str) -> slo.Outcomes:
    """crossover.slo.outcomes of one topology from the raw counters' rates, each from the roles the
    rules read it from; unfinished requests as the rules recorded them over the longest raw window
    (an average of the shortest window's recordings: promtool checks that figure)."""
    sel = f'{stack.rules.config.selector},topology="{topology}"'
    by_reason = {k[1]: v for k, v in _user_rates(stack, f"{catalog.REQUEST_SUCCESS.promql_name}{{{sel}}}",
                                                 at, window, ("topology", "finished_reason")).items()}
    rejected = _user_rates(stack, f"{catalog.ADMISSION_REJECTIONS.promql_name}{{{sel}}}", at, window)
    longest = max(stack.rules.dashboard_windows, key=parse_duration)
    unfinished = requests_name("unfinished", longest)
    recorded = stack.prometheus.query(f'{unfinished}{{topology="{topology}"}}', at)
    found = slo.outcomes(by_reason, rejected.get((topology,)), None)
    if not recorded:
        return found
    return slo.outcomes(by_reason, rejected.get((topology,)), found.total + recorded[0].value)


def test_joint_bounds_follow_from_the_per_slo_shares(stack: LiveStack) -> None:
    window = "1m"
    at, lower = _recorded(stack, joint_attainment_name("lower", window))
    upper = {s.labels["topology"]: s.value
             for s in stack.prometheus.query(joint_attainment_name("upper", window), at)}
    shares: dict[str, list[float]] = defaultdict(list)
    for bucket in stack.rules.slo_buckets:
        if bucket.slo in slo.PER_REQUEST_SLOS:
            for s in stack.prometheus.query(attainment_name(bucket.slo, window), at):
                shares[s.labels["topology"]].append(s.value)
    for topology, values in shares.items():
        assert _close(lower[topology], max(0.0, sum(values) - (len(values) - 1)), 1e-9)
        assert _close(upper[topology], min(values), 1e-9)
        assert lower[topology] <= upper[topology] + 1e-12  # 1 + a - 1 may differ from a in the last bit


def test_quantiles_and_kv_bandwidth_match_the_python_derivation(stack: LiveStack) -> None:
    sel = stack.rules.config.selector
    window = "1m"
    for metric in (catalog.TTFT, catalog.ITL):
        at, recorded = _recorded(stack, quantile_name(metric, 0.99, window))
        rates = _user_rates(stack, f"{metric.name}_bucket{{{sel}}}", at, window, ("topology", "le"))
        for topology, value in recorded.items():
            buckets = {float(le): r for (t, le), r in rates.items() if t == topology}
            want = _quantile(0.99, buckets)
            assert _close(value, want, REL), (metric.name, topology, value, want)
    at, recorded = _recorded(stack, kv_bandwidth_name(window))
    moved = _rates(stack, f'{{__name__=~"{KV_BYTES.names("_sum")}",{sel}}}', at, window)
    busy = _rates(stack, f'{{__name__=~"{KV_TIME.names("_sum")}",{sel}}}', at, window)
    assert recorded and all(_close(v, moved[(t,)] / busy[(t,)], REL) for t, v in recorded.items())


# ---- the exporter, deriving the same quantities from its own scrapes -------------------------

# Stated tolerances, rules vs exporter, when both 1m windows are full and hold the whole burst:
# rates divide the same increase by spans that differ by at most one scrape interval (2 s of 60 s,
# measured 0.1%); ratios of rates (quantiles, means, shares, bandwidth) divide the same increases, and
# only the per-target span weighting of a multi-instance sum differs (measured below 1e-6).
EXPORTER_RATE_REL = 0.05
EXPORTER_RATIO_REL = 0.02
EXPORTER_WINDOW = "1m"
SETTLE_S = 12.0  # after a burst: the last fleet scrape, an exporter cycle, its scrape, a rule evaluation
# Between the burst before and the one read: a rule read at an instant was evaluated up to a group
# interval earlier, over a window starting that much earlier still.
QUIET_S = 60.0
COUNTED = (catalog.TTFT, catalog.E2E_LATENCY)  # observed once per request, at its first token and its end


def _exporter_pairs(stack: LiveStack) -> list[tuple[str, str, str, str]]:
    """(recording rule, exporter suffix, extra matchers, how compared) for every recorded quantity
    the exporter also derives at the topology level. how: rate, ratio, exact (an on-boundary SLO
    share), or lower (the rules round an off-boundary SLO down, so theirs is an upper limit)."""
    w = EXPORTER_WINDOW
    tokens_per_gpu = "generation_tokens_per_second_per_gpu"
    pairs = [(rate_name(catalog.GENERATION_TOKENS, w), "generation_tokens_per_second", "", "rate"),
             (rate_name(catalog.PROMPT_TOKENS, w), "prompt_tokens_per_second", "", "rate"),
             (rate_name(catalog.REQUEST_SUCCESS, w), "requests_per_second", "", "rate"),
             (rate_name(catalog.NUM_PREEMPTIONS, w), "preemptions_per_second", "", "rate"),
             (per_gpu_name(catalog.GENERATION_TOKENS, w), tokens_per_gpu, "", "rate"),
             (histogram_rate_name(KV_BYTES, "sum", w), "kv_transfer_bytes_per_second", "", "rate"),
             (histogram_rate_name(KV_TIME, "count", w), "kv_transfers_per_second", "", "rate"),
             (rate_name(KV_FAILURES, w), "kv_transfer_failures_per_second", "", "rate"),
             (kv_bandwidth_name(w), "kv_transfer_bandwidth_bytes_per_second", "", "ratio")]
    metrics: tuple[tuple[Stemmed, str], ...] = (
        (catalog.TTFT, "ttft"), (catalog.TPOT, "tpot"), (catalog.ITL, "itl"), (catalog.E2E_LATENCY, "e2el"),
        (KV_TIME, "kv_transfer"))
    for metric, short in metrics:
        pairs += [(quantile_name(metric, q, w), f"{short}_seconds", f',quantile="{q:g}"', "ratio")
                  for q in slo.QUANTILES]
        pairs.append((mean_name(metric, w), f"{short}_mean_seconds", "", "ratio"))
    for bucket in stack.rules.slo_buckets:
        pairs.append((attainment_name(bucket.slo, w), "attainment_ratio", f',slo="{bucket.slo}"',
                      "exact" if bucket.exact else "lower"))
    joined = [b for b in stack.rules.slo_buckets if b.slo in slo.PER_REQUEST_SLOS]
    joint = "exact" if all(b.exact for b in joined) else "lower"
    pairs += [(joint_attainment_name("lower", w), "attainment_lower_ratio", "", joint),
              (joint_attainment_name("upper", w), "attainment_upper_ratio", "", joint),
              (goodput_tokens_name(w), "goodput_tokens_per_second_lower", "", joint),
              (goodput_tokens_name(w, per_gpu=True), "goodput_tokens_per_second_per_gpu_lower", "", joint)]
    return pairs


def _exporter_role_pairs(stack: LiveStack) -> list[tuple[str, str, str, str]]:
    """The same for the per-role rules of P/D topologies (the exporter's role level)."""
    w, level = EXPORTER_WINDOW, "topology_role"
    pairs = [(rate_name(catalog.REQUEST_SUCCESS, w, level), "requests_per_second", "", "rate"),
             (rate_name(catalog.GENERATION_TOKENS, w, level), "generation_tokens_per_second", "", "rate")]
    for metric, short in ((catalog.TTFT, "ttft"), (catalog.TPOT, "tpot"), (catalog.E2E_LATENCY, "e2el")):
        pairs += [(quantile_name(metric, q, w, level), f"{short}_seconds", f',quantile="{q:g}"', "ratio")
                  for q in slo.QUANTILES]
    for bucket in stack.rules.slo_buckets:
        if bucket.slo in slo.PER_REQUEST_SLOS:
            pairs.append((attainment_name(bucket.slo, w, level), "attainment_ratio",
                          f',slo="{bucket.slo}"', "exact" if bucket.exact else "lower"))
    return pairs


def _agree(how: str, a: float, b: float) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)):
        return False
    if how == "rate":
        return _close(a, b, EXPORTER_RATE_REL)
    if how in ("ratio", "exact"):
        return _close(a, b, EXPORTER_RATIO_REL)
    return a <= b * (1 + EXPORTER_RATE_REL) + 1e-9  # rounded down to the stricter bucket


Counts = dict[tuple[str, str, str], float]  # (latency, topology, role) -> requests


def _observations(stack: LiveStack, at: float) -> tuple[Counts, Counts]:
    """Requests each sampler holds in the window ending at `at`, per latency, topology and role:
    Prometheus's stored samples of the raw counts (last minus first) and the exporter's own."""
    from crossover.exporter import names

    sel = stack.rules.config.selector
    ours: Counts = defaultdict(float)
    theirs: Counts = {}
    for metric, short in zip(COUNTED, ("ttft", "e2el"), strict=True):
        for labels, values in stack.prometheus.query_range_vector(
                f"{metric.name}_count{{{sel}}}[{EXPORTER_WINDOW}]", at):
            ours[(short, labels["topology"], labels["role"])] += values[-1][1] - values[0][1]
        # The exporter's role level holds the P/D roles; a colocated topology is its own one role.
        for level in ("topology", "role"):
            exported = f'{names.derived_name(level, f"{short}_observations")}{{window="{EXPORTER_WINDOW}"}}'
            theirs.update({(short, s.labels["topology"], s.labels.get("role", "colocated")): s.value
                           for s in stack.prometheus.query(exported, at)})
    pd = {(short, topology) for short, topology, role in theirs if role != "colocated"}
    return dict(ours), {key: n for key, n in theirs.items() if key[2] != "colocated" or key[:2] not in pd}


def test_recorded_values_agree_with_the_exporter(stack: LiveStack) -> None:
    """Same window, same traffic, two samplers: Prometheus (rules over its scrapes) and the
    exporter (its own scrapes, served to the same Prometheus). Read at one instant when both 1m
    windows are full of samples and hold a whole burst, every rate agrees within 5% and every
    quantile, mean, SLO share, joint bound and bandwidth within 2%. An off-boundary SLO's share
    (and what derives from it) may only be lower in the rules, which round down to the stricter
    bucket while the exporter interpolates. Not compared: the instantaneous gauges (queue depth,
    KV usage), which the exporter reports as window aggregates of its own sampling instants. The
    per-role rules of P/D topologies are compared with the exporter's role level the same way."""
    require(stack.exporter_url is not None, "the exporter (crossover.exporter.service) is not available")
    from crossover.exporter import names

    prom = stack.prometheus
    window_s = parse_duration(EXPORTER_WINDOW)
    interval_s = stack.spec.scrape.interval_seconds
    # Every target (fleet and exporter) scraped for a whole window, so neither sampler's span is short.
    full = window_s / interval_s - 1
    scrapes = f"count_over_time(up[{EXPORTER_WINDOW}])"
    prom.wait_until(lambda: min(s.value for s in prom.query(scrapes)) >= full, window_s + 30,
                    f"a full {EXPORTER_WINDOW} of scrapes of every target")
    # Every window read below starts before this burst and after the one before.
    time.sleep(max(0.0, stack.traffic_ended + QUIET_S - time.monotonic()))
    started = time.time()
    stack.fresh_traffic(max_age_s=0.0)
    ended = time.time()
    # Every 1m group has evaluated since the burst's last samples landed; every window starts before it.
    at = ended + SETTLE_S + _window_groups_interval(stack)
    last = started + window_s - 2 * interval_s
    assert at <= last, f"a {ended - started:.0f}s burst is not inside a window"
    while True:
        time.sleep(max(0.0, at + interval_s - time.time()))
        prometheus_saw, exporter_saw = _observations(stack, at)
        if prometheus_saw == exporter_saw:
            break
        at += interval_s
        # A sampler that lags on a loaded machine catches up at a later instant, while the windows
        # still hold the whole burst.
        if at > last:
            pytest.fail(f"Prometheus and the exporter never held the same requests in a {EXPORTER_WINDOW} "
                        f"window over the burst: {prometheus_saw} vs {exporter_saw}")

    compared = 0
    levels = (("topology", "", _exporter_pairs(stack)),
              ("role", ',role!="colocated"', _exporter_role_pairs(stack)))
    for level, only_pd, pairs in levels:
        for recorded, suffix, extra, how in pairs:
            exported = f'{names.derived_name(level, suffix)}{{window="{EXPORTER_WINDOW}"{extra}}}'
            ours = {(s.labels["topology"], s.labels.get("role", "")): s.value
                    for s in prom.query(f"{recorded}{{{only_pd.lstrip(',')}}}", at)}
            theirs = {(s.labels["topology"], s.labels.get("role", "")): s.value
                      for s in prom.query(exported, at)}
            assert ours and set(ours) == set(theirs), (recorded, ours, theirs)
            for key in sorted(ours):
                assert _agree(how, ours[key], theirs[key]), (recorded, key, ours[key], theirs[key])
                compared += 1
    assert compared >= 70, compared  # 55 + 20 for the P/D spec
