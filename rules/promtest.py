"""A promtool unit-test file generated with the rules (`promtool test rules rules.test.yml`).

Input series are shaped like the simulator's and a real vLLM server's /metrics (same families,
labels, cumulative buckets, `le` spelled as prometheus_client writes it), plus the labels the scrape
config attaches. The first topology meets every SLO; the second misses each SLO for half of its
requests and spells `le` as Prometheus 3 and Go clients do ("1" not "1.0"), so the same matchers are
proven on both spellings. Expected values are computed here with Prometheus's own arithmetic.

A second test plays an outage: one target down, one serving the pre-0.11 KV-usage name and custom
TTFT buckets, so TargetDown, TopologyDown, MetricsAbsent and SloBucketMissing must fire.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from crossover import catalog, slo
from crossover.catalog import Metric, MetricType
from crossover.exporter.quantile import histogram_quantile
from crossover.rules import model as m
from crossover.rules.alerts import WATCHED_FAMILIES, AlertRule
from crossover.rules.buckets import request_slo_buckets
from crossover.rules.model import RuleSet
from crossover.rules.names import (
    BURN_ALERT,
    FAILURES_COUNTED_NAME,
    GPUS_NAME,
    REPLICA_LEVEL,
    ROLE_LEVEL,
    attainment_name,
    failed_requests_name,
    gauge_sum_name,
    goodput_requests_name,
    goodput_tokens_name,
    interactivity_name,
    joint_attainment_name,
    kv_bandwidth_name,
    kv_usage_name,
    per_gpu_name,
    quantile_name,
    rate_name,
    requests_source_name,
)
from crossover.rules.recording import LATENCY_HISTOGRAMS
from crossover.rules.render import dump, expand_annotation, header
from crossover.spec import ENTRYPOINT_ROLE, Instance, Role, Topology, entrypoint_replica, format_duration

GOOD_SHARE = (1.0, 0.5)  # per topology index (cycled): share of requests within every SLO
REQUESTS_PER_S = 1.0  # per instance, served
# Per topology index (cycled), failed requests/s per instance by reason: the first topology meets
# every latency SLO and fails half of its requests (errors alone must burn its budget).
FAILED_PER_S: tuple[dict[str, float], ...] = (
    {"error": 0.25, "abort": 0.25, slo.REJECTED_REASON: 0.25, slo.UNFINISHED_REASON: 0.25}, {})
CLIENT_ERRORS_PER_S = 0.5  # per instance, 4xx answers: counted nowhere
GENERATION_TOKENS_PER_S = 100.0
PROMPT_TOKENS_PER_S = 200.0
KV_USAGE = 0.5
RUNNING = 8.0
WAITING = 2.0
XFER_SECONDS = 0.0625  # exact in binary, so sums stay exact
XFER_BYTES = float(2**21)
MODEL_BUCKET_INDEX = 4  # where observations of histograms without an SLO land


def _go_spelling(value: float) -> str:
    """How Prometheus 3 / Go clients write a bucket boundary ("1", "0.05", "+Inf")."""
    if math.isinf(value):
        return "+Inf"
    return format(value, ".15g") if not value.is_integer() else str(int(value))


def _python_spelling(value: float) -> str:
    """How prometheus_client (vLLM) writes it ("1.0", "0.05", "+Inf")."""
    return "+Inf" if math.isinf(value) else repr(value)


@dataclass(frozen=True)
class _Shape:
    """Per-second observation counts per finite bucket plus +Inf for one instance."""

    bounds: tuple[float, ...]  # finite, then inf
    per_second: tuple[float, ...]  # non-cumulative per bound
    sum_per_second: float


def _latency_shape(metric: Metric, good_share: float, rules: RuleSet, failed_per_s: float = 0.0) -> _Shape:
    """Served requests, `good_share` of them at the SLO's bucket and the rest one bucket above;
    failed ones in the first bucket where vLLM observes them (slo.OBSERVES_FAILED)."""
    bounds = (*metric.buckets, math.inf)
    per_second = [0.0] * len(bounds)
    if any(slo.SLO_HISTOGRAMS[kind] is metric for kind in slo.OBSERVES_FAILED):
        per_second[0] += failed_per_s
    chosen = next((b for b in rules.slo_buckets if b.metric is metric), None)
    index = bounds.index(chosen.le) if chosen else MODEL_BUCKET_INDEX
    per_second[index] += REQUESTS_PER_S * good_share
    per_second[min(index + 1, len(bounds) - 1)] += REQUESTS_PER_S * (1 - good_share)
    total = sum(c * (b if math.isfinite(b) else bounds[-2]) for c, b in zip(per_second, bounds, strict=True))
    return _Shape(bounds, tuple(per_second), total)


def _fixed_shape(metric: Metric, value: float, per_s: float) -> _Shape:
    bounds = (*metric.buckets, math.inf)
    index = next(i for i, b in enumerate(bounds) if value <= b)
    per_second = [0.0] * len(bounds)
    per_second[index] = per_s
    return _Shape(bounds, tuple(per_second), value * per_s)


def _instance_labels(topology: Topology, instance: Instance, index: int) -> dict[str, str]:
    return {"job": m.JOB_NAME, "instance": f"127.0.0.1:{9100 + index}", "topology": topology.name,
            "role": instance.role.value, "gpus": str(topology.tp_of(instance)), "replica": instance.name}


def _series_name(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


class _Input:
    def __init__(self, interval_s: float, samples: int) -> None:
        self.interval_s = interval_s
        self.samples = samples
        self.series: list[dict[str, str]] = []

    def counter(self, name: str, labels: dict[str, str], per_s: float) -> None:
        step = per_s * self.interval_s
        self.series.append({"series": _series_name(name, labels), "values": f"0+{step!r}x{self.samples}"})

    def gauge(self, name: str, labels: dict[str, str], value: float) -> None:
        self.series.append({"series": _series_name(name, labels), "values": f"{value!r}+0x{self.samples}"})

    def histogram(self, metric: Metric, labels: dict[str, str], shape: _Shape, spell: Any) -> None:
        running = 0.0
        for bound, per_s in zip(shape.bounds, shape.per_second, strict=True):
            running += per_s
            self.counter(metric.name + "_bucket", {**labels, "le": spell(bound)}, running)
        self.counter(metric.name + "_count", labels, running)
        self.counter(metric.name + "_sum", labels, shape.sum_per_second)


def _entrypoint(data: _Input, rules: RuleSet, labels: dict[str, str], engine: dict[str, str], good: float,
                spell: Any, routed: bool = False) -> None:
    """What crossover's P/D proxy exposes: the request families only (catalog.ENTRYPOINT_FAMILIES).
    `routed`: a router whose request counter counts failed requests too (llm-d's), as the scrape
    config's metric relabelling leaves its series (rules/render.py, dialect_relabels)."""
    data.gauge("up", labels, 1.0)
    if routed:
        data.counter(catalog.REQUEST_SUCCESS.promql_name, {**engine, "finished_reason": slo.ROUTED_REASON},
                     REQUESTS_PER_S)
        data.counter(catalog.REQUEST_SUCCESS.promql_name, {**engine, "finished_reason": "error",
                                                           "error_code": "ModelServerError"}, 0.0)
    else:
        data.counter(catalog.REQUEST_SUCCESS.promql_name, {**engine, "finished_reason": "length"},
                     REQUESTS_PER_S)
    for metric in LATENCY_HISTOGRAMS:
        data.histogram(metric, engine, _latency_shape(metric, good, rules), spell)


def _serving_instance(data: _Input, rules: RuleSet, role: Role, labels: dict[str, str],
                      engine: dict[str, str], good: float, spell: Any, xfer_seconds: float = XFER_SECONDS,
                      failures_per_s: float = 0.0, failed: dict[str, float] | None = None) -> None:
    """Every series a vLLM instance of this role exposes (KV-transfer ones on decode only, of the
    spec's simulator.kv_connector), failing `failed` requests/s by slo.FAILURE_REASONS besides the
    served ones."""
    failed = failed or {}
    data.gauge("up", labels, 1.0)
    data.counter(catalog.GENERATION_TOKENS.promql_name, engine, GENERATION_TOKENS_PER_S)
    data.counter(catalog.PROMPT_TOKENS.promql_name, engine, PROMPT_TOKENS_PER_S)
    data.counter(catalog.REQUEST_SUCCESS.promql_name, {**engine, "finished_reason": "length"}, REQUESTS_PER_S)
    for reason in slo.FAILED_REASONS:
        data.counter(catalog.REQUEST_SUCCESS.promql_name, {**engine, "finished_reason": reason},
                     failed.get(reason, 0.0))
    model = {k: v for k, v in engine.items() if k != "engine"}
    data.counter(catalog.ADMISSION_REJECTIONS.promql_name, {**model, "reason": "max_num_queued_reqs"},
                 failed.get(slo.REJECTED_REASON, 0.0))
    # The API server's counter, as vLLM 0.32 answers (docs/slo.md): streams, cut or aborted ones
    # included, are 2xx; engine errors and admission rejections 5xx; bad input 4xx.
    by_status = {
        "2xx": REQUESTS_PER_S + failed.get("abort", 0.0) + failed.get(slo.UNFINISHED_REASON, 0.0),
        "4xx": CLIENT_ERRORS_PER_S,
        "5xx": failed.get("error", 0.0) + failed.get(slo.REJECTED_REASON, 0.0),
    }
    for status, per_s in by_status.items():
        served_by = {**labels, "handler": slo.SERVING_HANDLERS[0], "method": "POST", "status": status}
        data.counter(catalog.HTTP_REQUESTS.promql_name, served_by, per_s)
    data.counter(catalog.HTTP_REQUESTS.promql_name, {**labels, "handler": "/v1/models", "method": "GET",
                                                     "status": "2xx"}, 1.0)
    data.counter(catalog.NUM_PREEMPTIONS.promql_name, engine, 0.0)
    data.gauge(catalog.NUM_REQUESTS_RUNNING.promql_name, engine, RUNNING)
    data.gauge(catalog.NUM_REQUESTS_WAITING.promql_name, engine, WAITING)
    data.gauge(catalog.KV_CACHE_USAGE.promql_name, engine, KV_USAGE)
    failed_finished = sum(failed.get(r, 0.0) for r in slo.FAILED_REASONS)
    for metric in LATENCY_HISTOGRAMS:
        data.histogram(metric, engine, _latency_shape(metric, good, rules, failed_finished), spell)
    if role is Role.DECODE:
        connector = catalog.KV_CONNECTORS[rules.spec.simulator.kv_connector]
        data.histogram(connector.xfer_time, engine,
                       _fixed_shape(connector.xfer_time, xfer_seconds, REQUESTS_PER_S), spell)
        data.histogram(connector.bytes, engine,
                       _fixed_shape(connector.bytes, XFER_BYTES, REQUESTS_PER_S), spell)
        data.counter(connector.failed_transfers.promql_name, engine, failures_per_s)


def _sample_interval(rules: RuleSet) -> float:
    """Two samples or more in the shortest window; at most a minute."""
    shortest = min(m_parse(w) for w in rules.sli_windows)
    return float(max(1, min(60, math.floor(shortest / 2))))


def m_parse(window: str) -> float:
    from crossover.spec import parse_duration
    return parse_duration(window)


@dataclass(frozen=True)
class _Load:
    """The traffic the attainment test gives one topology, per instance."""

    good: float  # share of served requests within every SLO
    requests_from: str  # where the topology's request figures come from (requests_source_name)
    failed: dict[str, float]  # failed requests/s by reason

    @classmethod
    def of(cls, t_index: int, topology: Topology) -> _Load:
        requests_from = topology.configured_requests_source
        # Failures on colocated topologies only: one source of request figures, one count.
        failed = FAILED_PER_S[t_index % len(FAILED_PER_S)] if requests_from == "instances" else {}
        return cls(GOOD_SHARE[t_index % len(GOOD_SHARE)], requests_from, failed)

    @property
    def every_per_s(self) -> float:
        return REQUESTS_PER_S + sum(self.failed.values())

    @property
    def attained(self) -> float:
        # vLLM observes failed requests in the e2e and TPOT histograms (fast, within the SLO), so
        # every SLO kind comes out at the same attainment: the served share of the good share.
        return self.good * REQUESTS_PER_S / self.every_per_s

    @property
    def finished_per_s(self) -> float:
        return REQUESTS_PER_S + sum(self.failed.get(r, 0.0) for r in slo.FAILED_REASONS)


Expectation = tuple[str, dict[str, str], float]  # recording rule, its labels, its value


def _steps(rules: RuleSet) -> tuple[float, float, float]:
    """Sample interval, evaluation step and evaluation time of the tests."""
    interval = _sample_interval(rules)
    longest_for = max((a.for_s for a in rules.alerts), default=0.0)
    # Rule evaluation steps dominate promtool's time: take about 20 of them over the longest `for`.
    step = max(interval, min(300.0, math.floor((longest_for + 300) / 20 / interval) * interval))
    eval_s = math.ceil((longest_for + max(10 * interval, 300) + 2 * step) / step) * step
    return interval, step, eval_s


def _topology_key(rules: RuleSet, topology: Topology) -> dict[str, str]:
    return {"topology": topology.name, "model_name": rules.spec.model.name}


def _topology_series(data: _Input, rules: RuleSet, topology: Topology, load: _Load, index: int,
                     spell: Any) -> int:
    """Input series of the topology's instances and entrypoint; returns the next instance index."""
    model = {"model_name": rules.spec.model.name}
    for instance in topology.nominal_instances():
        labels = _instance_labels(topology, instance, index)
        index += 1
        engine = {**labels, **model, "engine": "0"}
        _serving_instance(data, rules, instance.role, labels, engine, load.good, spell, failed=load.failed)
    if topology.entrypoint.scraped:
        first = topology.nominal_instances()[0]
        labels = {**_instance_labels(topology, first, index), "role": ENTRYPOINT_ROLE,
                  "gpus": "0", "replica": entrypoint_replica(topology.name)}
        index += 1
        dialect = catalog.DIALECTS[topology.entrypoint.dialect or catalog.VLLM_DIALECT.name]
        _entrypoint(data, rules, labels, {**labels, **model, "engine": "0"}, load.good, spell,
                    routed=dialect.requests is not None)
    return index


def _quantile(rules: RuleSet, metric: Metric, q: float, load: _Load, instances: int) -> float:
    """The q-quantile of the topology's summed `metric` buckets, as its instances are shaped."""
    failed_finished = sum(load.failed.get(r, 0.0) for r in slo.FAILED_REASONS)
    shape = _latency_shape(metric, load.good, rules, failed_finished)
    cumulative = [0.0]
    for per_s in shape.per_second:
        cumulative.append(cumulative[-1] + per_s * instances)
    return histogram_quantile(q, zip(shape.bounds, cumulative[1:], strict=True))


def _expectations(rules: RuleSet, topology: Topology, load: _Load, window: str) -> list[Expectation]:
    """What the topology-level recording rules must come out at under `load`."""
    key = _topology_key(rules, topology)
    n = len(topology.nominal_instances())
    gpus = float(topology.gpus or n * topology.tensor_parallel_size)  # a selector topology: pods x TP
    request_slos = request_slo_buckets(rules.slo_buckets)
    lower, upper = slo.joint_bounds([load.attained] * len(request_slos))
    # Each request once: from the entrypoint or the decode role of a P/D topology; tokens
    # generated on the decode role only.
    serving = 1 if topology.disaggregated else n
    gen_rate = GENERATION_TOKENS_PER_S * serving
    expectations: list[Expectation] = [
        (GPUS_NAME, {"topology": topology.name}, gpus),
        (FAILURES_COUNTED_NAME, {"topology": topology.name}, 1.0),
        (requests_source_name(), {"topology": topology.name, "source": load.requests_from}, 1.0),
        (rate_name(catalog.REQUEST_SUCCESS, window), key, load.finished_per_s * serving),
        (rate_name(catalog.GENERATION_TOKENS, window), key, gen_rate),
        (per_gpu_name(catalog.GENERATION_TOKENS, window), key, gen_rate / gpus),
        (gauge_sum_name(catalog.NUM_REQUESTS_RUNNING), key, RUNNING * n),
        (kv_usage_name("max"), key, KV_USAGE),
        (quantile_name(catalog.TTFT, 0.99, window), key, _quantile(rules, catalog.TTFT, 0.99, load, n)),
        (interactivity_name(window), key,
         slo.interactivity(_quantile(rules, catalog.TPOT, slo.INTERACTIVITY_QUANTILE, load, n))),
    ]
    for bucket in rules.slo_buckets:
        expectations.append((attainment_name(bucket.slo, window), key, load.attained))
    for reason, per_s in load.failed.items():
        expectations.append((failed_requests_name(window), {**key, "reason": reason}, per_s * serving))
        # the dashboard's per-instance view, counted the same way
        for instance in topology.nominal_instances():
            replica = {**key, "role": instance.role.value, "replica": instance.name, "reason": reason}
            expectations.append((failed_requests_name(window, REPLICA_LEVEL), replica, per_s))
    if request_slos:
        expectations.append((joint_attainment_name("lower", window), key, lower))
        expectations.append((joint_attainment_name("upper", window), key, upper))
        expectations.append((goodput_requests_name(window), key, load.every_per_s * serving * lower))
        expectations.append((goodput_tokens_name(window), key, gen_rate * lower))
    if topology.disaggregated:
        expectations.append((kv_bandwidth_name(window), key, XFER_BYTES / XFER_SECONDS))
    if m.disaggregated_topologies(rules.spec):  # the per-role rules exist for every topology
        expectations.extend(_role_expectations(rules, topology, load, window))
    return expectations


def _role_expectations(rules: RuleSet, topology: Topology, load: _Load, window: str) -> list[Expectation]:
    roles = Counter(i.role.value for i in topology.nominal_instances())
    if topology.entrypoint.scraped:
        roles[ENTRYPOINT_ROLE] = 1
    expectations: list[Expectation] = []
    for role, count in roles.items():
        role_key = {"topology": topology.name, "role": role, "model_name": rules.spec.model.name}
        expectations.append((rate_name(catalog.REQUEST_SUCCESS, window, ROLE_LEVEL), role_key,
                             load.finished_per_s * count))
        for bucket in request_slo_buckets(rules.slo_buckets):
            name = attainment_name(bucket.slo, window, ROLE_LEVEL)
            expectations.append((name, role_key, load.attained))
    return expectations


def build_promtest(rules: RuleSet, rule_file: str, source: str) -> str:
    interval, step, eval_s = _steps(rules)
    data = _Input(interval, int(eval_s / interval) + 1)
    window = rules.dashboard_windows[0]
    if m_parse(window) < 2 * interval:
        raise ValueError(f"window {window} too short for sample interval {interval}")
    promql_tests: list[dict[str, Any]] = []
    expected_alerts: dict[str, list[dict[str, Any]]] = {a.alert: [] for a in rules.alerts}
    index = 0
    for t_index, topology in enumerate(rules.spec.topologies):
        load = _Load.of(t_index, topology)
        spell = _python_spelling if t_index % 2 == 0 else _go_spelling
        index = _topology_series(data, rules, topology, load, index, spell)
        for name, labels, value in _expectations(rules, topology, load, window):
            promql_tests.append({"expr": _series_name(name, labels), "eval_time": format_duration(eval_s),
                                 "exp_samples": [{"labels": _series_name(name, labels), "value": value}]})
        if load.attained < 1.0:
            _expect_burn(rules, expected_alerts, _topology_key(rules, topology), load.attained)
    tests = [{
        "name": "attainment per topology: one fails half of its requests within the latency SLOs, one "
                "serves all and misses the SLOs for half",
        "interval": format_duration(interval),
        "input_series": data.series,
        "promql_expr_test": promql_tests,
        "alert_rule_test": [{"eval_time": format_duration(eval_s), "alertname": name, "exp_alerts": alerts}
                            for name, alerts in expected_alerts.items()],
    }, _outage_test(rules, step), _undiscovered_test(rules, step)]
    document = {"rule_files": [rule_file], "evaluation_interval": format_duration(step), "tests": tests}
    return dump(document, header(source, "crossover rules"))


def _alert(rule: AlertRule, labels: dict[str, str]) -> dict[str, Any]:
    all_labels = {**labels, **rule.all_labels}
    templating = {**all_labels}
    return {"exp_labels": all_labels,
            "exp_annotations": {"summary": expand_annotation(rule.summary, templating),
                                "description": expand_annotation(rule.description, templating),
                                "runbook_url": rule.runbook_url}}


def _expect_burn(rules: RuleSet, expected: dict[str, list[dict[str, Any]]], key: dict[str, str],
                 attained: float) -> None:
    error = 1 - attained
    for rule in rules.alerts:
        if rule.alert == BURN_ALERT:
            tier = next(t for t in rules.tiers if ("long_window", t.long) in rule.labels)
            if error > tier.factor * rules.error_budget:
                for bucket in rules.slo_buckets:
                    expected[rule.alert].append(_alert(rule, {**key, "slo": bucket.slo}))
        elif rule.alert == "VllmErrorBudgetExhausted" and error >= rules.error_budget:
            for bucket in rules.slo_buckets:
                expected[rule.alert].append(_alert(rule, {**key, "slo": bucket.slo}))


def _undiscovered_test(rules: RuleSet, step: float) -> dict[str, Any]:
    """Prometheus scrapes nothing of the fleet (a scrape config or PodMonitor that matches no
    target): the per-target alerts have nothing to fire on, VllmTopologyAbsent must."""
    alert = next(a for a in rules.alerts if a.alert == "VllmTopologyAbsent")
    eval_s = math.ceil((alert.for_s + 2 * step) / step) * step
    other = {"job": "node", "instance": "node-exporter:9100"}  # something else Prometheus scrapes
    return {
        "name": "undiscovered: no target of the fleet is scraped",
        "interval": format_duration(step),
        "input_series": [{"series": _series_name("up", other), "values": f"1+0x{int(eval_s / step) + 1}"}],
        "alert_rule_test": [
            {"eval_time": format_duration(eval_s), "alertname": alert.alert,
             "exp_alerts": [_alert(alert, {"topology": t.name}) for t in rules.spec.topologies]},
            {"eval_time": format_duration(eval_s), "alertname": "VllmTargetDown", "exp_alerts": []},
        ],
    }


def _outage_test(rules: RuleSet, step: float) -> dict[str, Any]:
    """Topology 1's first instance is down; topology 2's first instance serves the legacy KV name
    and TTFT buckets without the SLO boundary."""
    spec = rules.spec
    interval = 60.0
    longest_for = max((a.for_s for a in rules.alerts if a.alert != BURN_ALERT), default=0.0)
    # Rules are evaluated every `step`: leave two whole steps after the longest `for` has run out.
    eval_s = math.ceil((longest_for + interval + 2 * step) / step) * step
    samples = int(eval_s / interval) + 1
    data = _Input(interval, samples)
    expected: dict[str, list[dict[str, Any]]] = {name: [] for name in (
        "VllmTargetDown", "VllmTopologyDown", "VllmMetricsAbsent", "VllmSloBucketMissing")}
    by_name = {a.alert: a for a in rules.alerts}
    down_topology = spec.topologies[0]
    down = _instance_labels(down_topology, down_topology.nominal_instances()[0], 0)
    data.gauge("up", down, 0.0)
    expected["VllmTargetDown"].append(_alert(by_name["VllmTargetDown"], down))
    expected["VllmTopologyDown"].append(_alert(by_name["VllmTopologyDown"], {"topology": down_topology.name}))
    if len(spec.topologies) > 1:
        renamed_topology = spec.topologies[1]
        labels = _instance_labels(renamed_topology, renamed_topology.nominal_instances()[0], 1)
        engine = {**labels, "model_name": spec.model.name, "engine": "0"}
        data.gauge("up", labels, 1.0)
        for metric in WATCHED_FAMILIES:
            if metric is catalog.KV_CACHE_USAGE:
                data.gauge(metric.aliases[0], engine, KV_USAGE)  # the pre-0.11 name
            elif metric.type is MetricType.HISTOGRAM:
                shifted = metric.buckets
                ttft = next((b for b in rules.slo_buckets if b.metric is metric), None)
                if ttft is not None and ttft.slo == rules.slo_buckets[0].slo:
                    shifted = tuple(b for b in metric.buckets if b != ttft.le)  # custom buckets
                    expected["VllmSloBucketMissing"].append(
                        _alert(by_name["VllmSloBucketMissing"],
                               {**engine, "slo": ttft.slo}))
                shape = _Shape((*shifted, math.inf), tuple([0.0] * len(shifted) + [REQUESTS_PER_S]), 1.0)
                data.histogram(metric, engine, shape, _python_spelling)
            elif metric.type is MetricType.COUNTER:
                data.counter(metric.promql_name, engine, 1.0)
            else:
                data.gauge(metric.promql_name, engine, 1.0)
        expected["VllmMetricsAbsent"].append(
            _alert(by_name["VllmMetricsAbsent"], {**labels, "metric": catalog.KV_CACHE_USAGE.name}))
    pd = next((t for t in spec.topologies if t.disaggregated), None)
    scraped = {t.name for t in (*spec.topologies[:2], *((pd,) if pd else ()))}
    expected["VllmTopologyAbsent"] = [_alert(by_name["VllmTopologyAbsent"], {"topology": t.name})
                                      for t in spec.topologies if t.name not in scraped]
    if pd is not None:
        # A decode instance whose KV transfers take 1 s (over any sane --kv-transfer-p99-ms) and fail.
        decode = next(i for i in pd.nominal_instances() if i.role is Role.DECODE)
        labels = _instance_labels(pd, decode, 2)
        engine = {**labels, "model_name": spec.model.name, "engine": "0"}
        _serving_instance(data, rules, Role.DECODE, labels, engine, 1.0, _python_spelling, xfer_seconds=1.0,
                          failures_per_s=0.5)
        key = {"topology": pd.name, "model_name": spec.model.name}
        for name in ("VllmKvTransferSlow", "VllmKvTransferFailures"):
            expected[name] = [_alert(by_name[name], key)]
    counted: list[dict[str, Any]] = []
    if len(spec.topologies) > 1:  # the renamed instance's requests counter has no finished_reason
        name, labels = FAILURES_COUNTED_NAME, {"topology": spec.topologies[1].name}
        counted.append({"expr": f'{name}{{topology="{labels["topology"]}"}}',
                        "eval_time": format_duration(eval_s),
                        "exp_samples": [{"labels": _series_name(name, labels), "value": 0.0}]})
    return {
        "name": "outage: a target down, a renamed metric, custom buckets without the SLO boundary, "
                "vLLM without finished_reason",
        "interval": format_duration(interval),
        "input_series": data.series,
        **({"promql_expr_test": counted} if counted else {}),
        "alert_rule_test": [{"eval_time": format_duration(eval_s), "alertname": name, "exp_alerts": alerts}
                            for name, alerts in expected.items()],
    }
