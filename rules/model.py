"""Spec -> a small plain-data model of Prometheus recording rules and alerts.

Everything that later becomes YAML (rules, the PrometheusRule resource, the promtool unit tests)
and every recording-rule name a dashboard queries comes from `build_rules`, so rules, tests and
dashboards cannot drift apart. No vLLM metric name is spelled here: they all come from the catalog.

Naming follows Prometheus practice `level:metric:operations`:
  topology:vllm_generation_tokens:rate1m               sum by topology of a counter's rate
  topology:vllm_time_to_first_token_seconds:p99_1m     quantile of the topology-summed buckets
  topology:vllm_goodput_tpot:ratio_rate5m              share of requests within the TPOT SLO
  slo:sli_error:ratio_rate1h{slo="tpot"}               Sloth-style SLI error, for burn-rate alerts
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from crossover import catalog, slo
from crossover.catalog import Metric
from crossover.errors import UserError
from crossover.spec import (
    ENTRYPOINT_ROLE,
    REQUEST_SOURCES,
    FleetSpec,
    Role,
    format_duration,
    parse_duration,
)

# Labels every aggregated series keeps: the topology the scrape config attached, and the model.
TOPOLOGY_BY = ("topology", "model_name")
ROLE_BY = ("topology", "role", "model_name")
# The level of the per-role figures: its names start with it (topology_role:...).
ROLE_LEVEL = "topology_role"
# Per replica (the scrape config's and PodMonitor's `replica` label): the request outcome families,
# read raw once here; the per-role outcome figures are sums of these.
REPLICA_BY = ("topology", "role", "replica", "model_name")
REPLICA_LEVEL = "topology_replica"
JOB_NAME = "vllm"
DEFAULT_SELECTOR = f'job="{JOB_NAME}"'
REFERENCE_PERIOD_S = 30 * 86400.0  # the SRE workbook's burn table is written for 30 days
# Histograms whose quantiles and means are recorded per topology.
LATENCY_HISTOGRAMS: tuple[Metric, ...] = (catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY)
# The requests counter is recorded once, by finished_reason, with the other outcome families
# (_Builder.outcome_rates); its sum per topology is built on that recording.
RATE_COUNTERS: tuple[Metric, ...] = (catalog.GENERATION_TOKENS, catalog.PROMPT_TOKENS,
                                     catalog.NUM_PREEMPTIONS)
GAUGES_SUMMED: tuple[Metric, ...] = (catalog.NUM_REQUESTS_RUNNING, catalog.NUM_REQUESTS_WAITING)
# A P/D request is one request on the prefill instance (max_tokens 1) and one on the decode instance,
# so topology-level request figures of a P/D topology count it twice and mix two populations; these
# are also recorded per role (level topology_role) for fleets with a P/D topology.
ROLE_COUNTERS: tuple[Metric, ...] = (catalog.GENERATION_TOKENS,)
ROLE_HISTOGRAMS: tuple[Metric, ...] = (catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY)


class Stemmed(Protocol):
    """What a recording-rule name is built from: a catalog Metric, or a KvFamily."""

    @property
    def rule_stem(self) -> str: ...


@dataclass(frozen=True)
class KvFamily:
    """One KV-transfer quantity read from whichever connector's family an instance exposes
    (catalog.KV_CONNECTORS: NIXL, Mooncake); time and bytes share their buckets across connectors."""

    rule_stem: str
    metrics: tuple[Metric, ...]

    def names(self, suffix: str | None = None) -> str:
        """A `__name__` regex matching the family's samples of every connector (`suffix` as in
        _Builder.raw: None for the counters' PromQL names)."""
        return "|".join(re.escape(m.promql_name if suffix is None else m.name + suffix) for m in self.metrics)


KV_TIME = KvFamily("vllm_kv_transfer_time_seconds",
                   tuple(c.xfer_time for c in catalog.KV_CONNECTORS.values()))
KV_BYTES = KvFamily("vllm_kv_transfer_bytes", tuple(c.bytes for c in catalog.KV_CONNECTORS.values()))
KV_FAILURES = KvFamily("vllm_kv_transfer_failures",
                       tuple(c.failed_transfers for c in catalog.KV_CONNECTORS.values()))
KV_HISTOGRAMS: tuple[KvFamily, ...] = (KV_TIME, KV_BYTES)

# A topology as its users see it (docs/routers.md): request families from its entrypoint targets,
# else from its decode role, else from its instances (colocated); never from both P/D roles.
# Generated tokens leave out the prefill role (its one token per request is no output), prompt
# tokens the decode role; nothing else is read from an entrypoint. The request outcome families
# (crossover.slo) follow the same choice, so a P/D request is never counted on both roles.
REQUEST_FAMILIES: frozenset[str] = frozenset(m.name for m in (*catalog.ENTRYPOINT_FAMILIES,
                                                              *slo.OUTCOME_FAMILIES))
ENTRYPOINT_MATCHER = f'role="{ENTRYPOINT_ROLE}"'
USER_SOURCES: tuple[tuple[str, str], ...] = tuple(zip(REQUEST_SOURCES, (
    ENTRYPOINT_MATCHER,
    f'role="{Role.DECODE.value}"',
    f'role!~"{ENTRYPOINT_ROLE}|{Role.PREFILL.value}|{Role.DECODE.value}"'), strict=True))
TOPOLOGY_ROLES: dict[str, str] = {
    catalog.GENERATION_TOKENS.name: f'role!~"{ENTRYPOINT_ROLE}|{Role.PREFILL.value}"',
    catalog.PROMPT_TOKENS.name: f'role!~"{ENTRYPOINT_ROLE}|{Role.DECODE.value}"',
}
NOT_ENTRYPOINT = f'role!="{ENTRYPOINT_ROLE}"'

# Families whose absence on an up target means a vLLM rename (or a broken exporter of them).
WATCHED_FAMILIES: tuple[Metric, ...] = (
    catalog.GENERATION_TOKENS, catalog.PROMPT_TOKENS, catalog.REQUEST_SUCCESS, catalog.NUM_PREEMPTIONS,
    catalog.NUM_REQUESTS_RUNNING, catalog.NUM_REQUESTS_WAITING, catalog.KV_CACHE_USAGE,
    catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY,
)


@dataclass(frozen=True)
class BurnTier:
    """One row of the multi-window multi-burn-rate table."""

    severity: str
    long_s: float
    short_s: float
    budget_share: float  # share of the period's error budget this tier pages on
    for_s: float
    factor: float  # burn rate: budget_share x period / long window

    @property
    def long(self) -> str:
        return format_duration(self.long_s)

    @property
    def short(self) -> str:
        return format_duration(self.short_s)


# Google SRE workbook / Sloth / kubernetes-mixin, for a 30-day period: (severity, long, short, share, for).
REFERENCE_TIERS: tuple[tuple[str, float, float, float, float], ...] = (
    ("critical", 3600.0, 300.0, 0.02, 120.0),
    ("critical", 6 * 3600.0, 1800.0, 0.05, 900.0),
    ("warning", 86400.0, 2 * 3600.0, 0.10, 3600.0),
    ("warning", 3 * 86400.0, 6 * 3600.0, 0.10, 3 * 3600.0),
)


def promql_string(value: str) -> str:
    """A PromQL string literal (double-quoted, backslashes and quotes escaped)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True)
class SloBucket:
    """Which histogram bucket an SLO reads, and whether that is the SLO exactly."""

    slo: str
    threshold_ms: float
    metric: Metric
    le: float  # the bucket boundary in seconds
    exact: bool

    @property
    def le_regex(self) -> str:
        return le_regex(self.le)

    @property
    def le_matcher(self) -> str:
        """`le=~"..."` with the regex escaped for a PromQL string literal."""
        return "le=~" + promql_string(self.le_regex)


@dataclass(frozen=True)
class RecordingRule:
    record: str
    expr: str
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class AlertRule:
    alert: str
    expr: str
    for_s: float
    severity: str
    summary: str
    description: str
    runbook_url: str
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def all_labels(self) -> dict[str, str]:
        return {"severity": self.severity, **dict(self.labels)}


@dataclass(frozen=True)
class RuleGroup:
    name: str
    rules: tuple[RecordingRule | AlertRule, ...]
    interval_s: float | None = None  # None: Prometheus's global evaluation_interval

    @property
    def interval(self) -> str | None:
        return None if self.interval_s is None else format_duration(self.interval_s)


@dataclass(frozen=True)
class RulesConfig:
    """Knobs of the generator; the defaults suit a real fleet."""

    selector: str = DEFAULT_SELECTOR  # PromQL matchers every raw vLLM series is read with
    window_scale: float = 1.0  # <1 shrinks the SLO period and all alert windows (test profile)
    kv_transfer_p99_ms: float = 500.0
    refuse_off_boundary: bool = False  # refuse an SLO off a bucket boundary instead of rounding
    runbook_base: str = "docs/runbooks.md"

    def __post_init__(self) -> None:
        if not 0 < self.window_scale <= 1:
            raise UserError(f"--window-scale: must be in (0, 1], got {self.window_scale:g}")
        if not (self.kv_transfer_p99_ms > 0 and math.isfinite(self.kv_transfer_p99_ms)):
            raise UserError("--kv-transfer-p99-ms: must be a positive number, "
                            f"got {self.kv_transfer_p99_ms:g}")
        if not re.fullmatch(r'\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"\s*'
                            r'(,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=|!=|=~|!~)\s*"[^"]*"\s*)*', self.selector):
            raise UserError(f"--selector: {self.selector!r} is not a list of PromQL label matchers "
                            '(e.g. job="vllm",namespace="prod")')


@dataclass(frozen=True)
class RuleSet:
    """The whole generated model for one spec."""

    spec: FleetSpec
    config: RulesConfig
    groups: tuple[RuleGroup, ...]
    slo_buckets: tuple[SloBucket, ...]
    tiers: tuple[BurnTier, ...]
    dashboard_windows: tuple[str, ...]  # the spec's scrape.windows: quantiles, throughput, goodput
    sli_windows: tuple[str, ...]  # every window an SLI ratio is recorded for
    period: str  # the (possibly scaled) SLO period
    kv_window: str
    warnings: tuple[str, ...] = field(default=())

    @property
    def records(self) -> tuple[RecordingRule, ...]:
        return tuple(r for g in self.groups for r in g.rules if isinstance(r, RecordingRule))

    @property
    def alerts(self) -> tuple[AlertRule, ...]:
        return tuple(r for g in self.groups for r in g.rules if isinstance(r, AlertRule))

    @property
    def record_names(self) -> frozenset[str]:
        return frozenset(r.record for r in self.records)

    @property
    def error_budget(self) -> float:
        return error_budget(self.spec)


def error_budget(spec: FleetSpec) -> float:
    """1 - objective, rounded so 0.99 gives 0.01 and not 0.010000000000000009 in the YAML."""
    return round(1.0 - spec.slos.objective, 12)


# ---- names shared with the dashboards --------------------------------------------------------

def rate_name(metric: Stemmed, window: str, level: str = "topology") -> str:
    return f"{level}:{metric.rule_stem}:rate{window}"


def histogram_rate_name(metric: Stemmed, part: str, window: str, level: str = "topology") -> str:
    """part is bucket, count or sum."""
    return f"{level}:{metric.rule_stem}_{part}:rate{window}"


def quantile_name(metric: Stemmed, quantile: float, window: str, level: str = "topology") -> str:
    return f"{level}:{metric.rule_stem}:{slo.percentile_label(quantile)}_{window}"


def mean_name(metric: Stemmed, window: str) -> str:
    return f"topology:{metric.rule_stem}:mean_{window}"


def per_gpu_name(metric: Metric, window: str) -> str:
    return f"topology:{metric.rule_stem}_per_gpu:rate{window}"


def gauge_sum_name(metric: Metric, level: str = "topology") -> str:
    return f"{level}:{metric.rule_stem}:sum"


def kv_usage_name(operation: str) -> str:
    """operation is max or avg."""
    return f"topology:{catalog.KV_CACHE_USAGE.rule_stem}:{operation}"


def attainment_name(kind: str, window: str, level: str = "topology") -> str:
    """Share of all requests served within one SLO (crossover.slo)."""
    return f"{level}:vllm_{slo.ATTAINMENT}_{kind}:ratio_rate{window}"


def joint_attainment_name(bound: str, window: str) -> str:
    """bound is lower or upper: max(0, sum(a_i)-(n-1)) <= joint <= min(a_i)."""
    return f"topology:vllm_{slo.ATTAINMENT}:ratio_{bound}_rate{window}"



def requests_name(outcome: str, window: str, level: str = "topology") -> str:
    """Requests per second by outcome (crossover.slo.Outcomes): all the fleet should have served
    (finished + rejected at admission), served, or failed and finished by the engine (abort, error)."""
    stem = "vllm_requests" if outcome == "all" else f"vllm_requests_{outcome}"
    return f"{level}:{stem}:rate{window}"


def good_requests_name(kind: str, window: str, level: str = "topology") -> str:
    """Requests per second served within one SLO (attainment x all requests): a rate, so long
    windows are averages of a short window's recordings."""
    return f"{level}:vllm_requests_good_{kind}:rate{window}"


def finished_by_reason_name(window: str, level: str = "topology") -> str:
    """The requests counter's rate by finished_reason: the one recording of that raw rate."""
    return f"{level}_finished_reason:{catalog.REQUEST_SUCCESS.rule_stem}:rate{window}"


def api_requests_name(window: str, level: str = "topology") -> str:
    """The API server's requests the fleet should have served (slo.is_fleet_request)."""
    return f"{level}:{catalog.HTTP_REQUESTS.rule_stem}_fleet:rate{window}"


def failed_requests_name(window: str, level: str = "topology") -> str:
    """Failed requests per second by `reason` (slo.FAILURE_REASONS)."""
    return f"{level}:vllm_failed_requests:rate{window}"


def goodput_requests_name(window: str) -> str:
    return f"topology:vllm_{slo.GOODPUT}_requests:rate{window}"


def goodput_tokens_name(window: str, per_gpu: bool = False) -> str:
    return f"topology:vllm_{slo.GOODPUT}_tokens{'_per_gpu' if per_gpu else ''}:rate{window}"


def kv_bandwidth_name(window: str) -> str:
    return f"topology:{KV_BYTES.rule_stem}_per_xfer_second:ratio_rate{window}"


def requests_source_name() -> str:
    """1 per topology, `source` = where its request figures come from (entrypoint, decode, instances)."""
    return "topology:vllm_requests_source:info"


GPUS_NAME = "topology:gpus:sum"
FAILURES_COUNTED_NAME = f"topology:vllm_{slo.FAILURES_COUNTED}:min"
SLI_ERROR_PREFIX = "slo:sli_error:ratio_rate"
OBJECTIVE_NAME = "slo:objective:ratio"
BUDGET_REMAINING_NAME = "slo:error_budget_remaining:ratio"


def sli_error_name(window: str) -> str:
    return f"{SLI_ERROR_PREFIX}{window}"


# ---- le matching -----------------------------------------------------------------------------

def le_spellings(value: float) -> tuple[str, ...]:
    """Text forms an exposition may give a bucket boundary: prometheus_client writes repr ("1.0"),
    Go clients and Prometheus 3's normalisation write Go's shortest 'g' form ("1", "1e+06"), others
    the plain positional form. Every form listed parses back to exactly `value`."""
    positional = np.format_float_positional(value, unique=True, trim="-")
    scientific = np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)
    forms = {repr(value), positional, scientific}
    if "." not in positional:
        forms.add(positional + ".0")
    return tuple(sorted(f for f in forms if _same_float(f, value)))


def _same_float(text: str, value: float) -> bool:
    try:
        return float(text) == value
    except ValueError:
        return False


def le_regex(value: float) -> str:
    """A regex matching the bucket whatever spelling of its boundary the target or Prometheus uses."""
    return "|".join(re.escape(form) for form in le_spellings(value))


BURN_ALERT = "VllmGoodputBudgetBurn"  # the multi-window burn-rate alert on the goodput SLO


def request_slo_buckets(buckets: Iterable[SloBucket]) -> list[SloBucket]:
    """The buckets of the SLOs that enter the joint bounds (crossover.slo.PER_REQUEST_SLOS)."""
    return [b for b in buckets if b.slo in slo.PER_REQUEST_SLOS]


def slo_buckets(spec: FleetSpec, refuse_off_boundary: bool = False,
                source: str = "spec") -> tuple[tuple[SloBucket, ...], tuple[str, ...]]:
    """Pick each SLO's bucket: the boundary itself, or the stricter neighbour below it (with a
    warning), never a looser one; refuse when asked to, or when no boundary lies below."""
    chosen: list[SloBucket] = []
    warnings: list[str] = []
    for kind, threshold_ms in spec.slos.thresholds_ms.items():
        metric = slo.SLO_HISTOGRAMS[kind]
        threshold_s = threshold_ms / 1000.0
        boundary = slo.boundary_index(threshold_s, metric.buckets)
        if boundary is not None:
            chosen.append(SloBucket(kind, threshold_ms, metric, metric.buckets[boundary], exact=True))
            continue
        below, _above = slo.bucket_neighbours(threshold_s, metric.buckets)
        where = f"{source}: slos.{kind}_ms: {slo.not_a_boundary(threshold_ms, metric.name, metric.buckets)}"
        if refuse_off_boundary:
            raise UserError(f"{where}; pick a boundary or drop --refuse-off-boundary to round down")
        if below is None:
            raise UserError(f"{where}; no stricter boundary exists below it, pick one of the buckets")
        chosen.append(SloBucket(kind, threshold_ms, metric, below, exact=False))
        warnings.append(f"{where}; the rules count a request as good only below {below * 1000:g} ms "
                        "(the stricter neighbour), so goodput is a lower bound")
    return tuple(chosen), tuple(warnings)


# ---- windows ---------------------------------------------------------------------------------

def _round_window(seconds: float, floor_s: float) -> float:
    """Whole seconds, and at least four scrapes so rate() always sees two samples or more."""
    return float(max(round(seconds), math.ceil(floor_s)))


def burn_tiers(period_s: float, objective: float, scrape_interval_s: float) -> tuple[BurnTier, ...]:
    """Scale the 30-day table to the period (as Pyrra does) and compute each factor from it."""
    scale = period_s / REFERENCE_PERIOD_S
    floor = 4 * scrape_interval_s
    tiers = []
    for severity, long_s, short_s, share, for_s in REFERENCE_TIERS:
        long_w = _round_window(long_s * scale, floor)
        short_w = _round_window(short_s * scale, floor)
        factor = share * period_s / long_w
        tiers.append(BurnTier(severity, long_w, short_w, share, float(round(for_s * scale)),
                              round(factor, 6)))
    return tuple(tiers)


def unreachable_tiers(tiers: tuple[BurnTier, ...], objective: float, source: str) -> tuple[str, ...]:
    """A warning for each tier whose threshold is 100% errors or more: it can never fire (a loose
    objective such as 0.9 with the 14.4x page); the other tiers still guard the budget."""
    return tuple(
        f"{source}: slos.objective: {objective:g} over the {t.long}/{t.short} windows needs a burn "
        f"threshold of {t.factor:g} x {1 - objective:.3g} = {t.factor * (1 - objective):.3g} (over 100% "
        "errors): that alert tier can never fire" for t in tiers if t.factor * (1 - objective) >= 1)


# ---- the builder -----------------------------------------------------------------------------

def build_rules(spec: FleetSpec, config: RulesConfig | None = None, source: str = "spec") -> RuleSet:
    config = config or RulesConfig()
    buckets, warnings = slo_buckets(spec, config.refuse_off_boundary, source)
    period_s = float(round(spec.slos.period_seconds * config.window_scale))
    interval_s = spec.scrape.interval_seconds
    floor_s = 4 * interval_s
    tiers = burn_tiers(period_s, spec.slos.objective, interval_s)
    warnings = (*warnings, *unreachable_tiers(tiers, spec.slos.objective, source))
    kv_window = format_duration(_round_window(300.0 * config.window_scale, floor_s))
    dashboard_windows = tuple(spec.scrape.windows)
    sli_seconds = {*spec.scrape.window_seconds, *(t.long_s for t in tiers), *(t.short_s for t in tiers),
                   period_s}
    sli_windows = tuple(format_duration(s) for s in sorted(sli_seconds))
    # Raw series are read over the dashboard windows and the shortest SLI window only; every longer
    # SLI window is an average of a shorter window's recordings (as Sloth builds long windows).
    shortest = min(sli_seconds)
    raw_windows = tuple(format_duration(w) for w in sorted({*spec.scrape.window_seconds, shortest}))
    fast_s = float(max(interval_s, round(shortest / 4)))  # a few evaluations per shortest window
    long_s = float(max(fast_s, round(60 * config.window_scale)))
    builder = _Builder(spec, config, buckets, tiers, period_s, kv_window)
    groups = (
        # One group from raw rates to attainment: every recording it reads is of the same evaluation.
        RuleGroup("crossover-topology", (*builder.topology_rules(raw_windows, dashboard_windows),
                                         *builder.goodput_rules(raw_windows, dashboard_windows)), fast_s),
        RuleGroup("crossover-slo-windows", builder.long_window_rules(
            raw_windows, tuple(w for w in sli_windows if w not in raw_windows)), long_s),
        # Per replica, then (P/D fleets) per role summed from the replicas' recordings of this evaluation.
        RuleGroup("crossover-replicas", (*builder.replica_rules(dashboard_windows),
                                         *(builder.role_rules(dashboard_windows)
                                           if disaggregated_topologies(spec) else ())), fast_s),
        RuleGroup("crossover-kv-transfer", builder.kv_rules(tuple(dict.fromkeys((*dashboard_windows,
                                                                                   kv_window)))), fast_s),
        RuleGroup("crossover-slo-alerts", builder.slo_alerts(), fast_s),
        RuleGroup("crossover-fleet-alerts", builder.fleet_alerts(), fast_s),
    )
    return RuleSet(spec, config, groups, buckets, tiers, dashboard_windows, sli_windows,
                   format_duration(period_s), kv_window, warnings)


def _by(labels: tuple[str, ...]) -> str:
    return ", ".join(labels)


@dataclass(frozen=True)
class _Builder:
    spec: FleetSpec
    config: RulesConfig
    buckets: tuple[SloBucket, ...]
    tiers: tuple[BurnTier, ...]
    period_s: float
    kv_window: str

    def sel(self, name: str, extra: str = "", first: str = "") -> str:
        """`name{first,selector,extra}`: the configured selector between the given matchers."""
        matchers = ",".join(m for m in (first, self.config.selector.strip(), extra) if m)
        return f"{name}{{{matchers}}}"

    def runbook(self, alert: str) -> str:
        return f"{self.config.runbook_base}#{alert.lower()}"

    def raw(self, family: Metric | KvFamily, suffix: str | None = None, extra: str = "",
            role: str = "") -> str:
        """A selector of a family's raw samples: `suffix` `_bucket`, `_sum` or `_count`, or None for
        a counter's or gauge's PromQL name; `role` a matcher on the scrape config's role label."""
        if isinstance(family, KvFamily):
            return self.sel("", ",".join(m for m in (f'__name__=~"{family.names(suffix)}"', extra) if m))
        name = family.promql_name if suffix is None else family.name + suffix
        return self.sel(name, extra, first=role)

    def summed_rate(self, family: Metric | KvFamily, window: str, by: tuple[str, ...] = TOPOLOGY_BY,
                    suffix: str | None = None, extra: str = "") -> str:
        """Summed rate of a family's raw samples (`raw`). Per topology (no role in `by`) the roles are
        picked as the topology's users see it: see REQUEST_FAMILIES and TOPOLOGY_ROLES."""
        def summed(role: str = "") -> str:
            return f"sum by ({_by(by)}) (rate({self.raw(family, suffix, extra, role)}[{window}]))"

        if "role" in by or isinstance(family, KvFamily):
            return summed()
        if family.name in REQUEST_FAMILIES:  # parenthesised: callers divide and multiply it
            choices = "\n  or on (topology)\n  ".join(summed(role) for _, role in USER_SOURCES)
            return f"(\n  {choices}\n)"
        return summed(TOPOLOGY_ROLES.get(family.name, NOT_ENTRYPOINT))

    def entrypoint_request_series(self) -> str:
        """The entrypoint targets' series that show they expose the request families
        (catalog.ENTRYPOINT_FAMILIES): without them a topology's request figures fall back to decode."""
        families = promql_string("|".join(re.escape(m.presence_name) for m in catalog.ENTRYPOINT_FAMILIES))
        return self.sel("", f"__name__=~{families},{ENTRYPOINT_MATCHER}")

    def requests_source(self) -> RecordingRule:
        """Which source summed_rate picks per topology, for dashboards to show beside its figures."""
        exposed = {"entrypoint": self.entrypoint_request_series()}
        branches = []
        for source, role in USER_SOURCES:
            series = exposed.get(source, self.sel("up", role))
            branches.append(f'label_replace(group by (topology) ({series}), "source", "{source}", "", "")')
        return RecordingRule(requests_source_name(), "\nor on (topology)\n".join(branches))

    def failures_counted(self) -> RecordingRule:
        """1 per topology when every vLLM target exposes finished_reason, so failed requests count;
        0 when one does not (older vLLM: its attainment is the histogram share alone, docs/slo.md)."""
        success = self.sel(catalog.REQUEST_SUCCESS.promql_name, f'{NOT_ENTRYPOINT},finished_reason=~".+"')
        up = self.sel("up", NOT_ENTRYPOINT)
        counted = f"group by (topology, instance) ({success})"
        return RecordingRule(FAILURES_COUNTED_NAME,
                             f"min by (topology) (\n  {counted}\n  or on (topology, instance)\n"
                             f"  0 * group by (topology, instance) ({up} == 1)\n)")

    def topology_rules(self, windows: tuple[str, ...],
                       dashboard_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = [
            RecordingRule(GPUS_NAME, f"vector({t.gpus})", (("topology", t.name),))
            for t in self.spec.topologies
        ]
        rules.append(self.requests_source())
        rules.append(self.failures_counted())
        for metric in GAUGES_SUMMED:
            rules.append(RecordingRule(gauge_sum_name(metric), f"sum by ({_by(TOPOLOGY_BY)}) "
                                       f"({self.sel(metric.promql_name)})"))
            rules.append(RecordingRule(gauge_sum_name(metric, ROLE_LEVEL), f"sum by ({_by(ROLE_BY)}) "
                                       f"({self.sel(metric.promql_name)})"))
        kv = self.sel(catalog.KV_CACHE_USAGE.promql_name)
        # Instances of one topology have equal KV pools, so the mean of their usage is the pool's usage.
        rules.append(RecordingRule(kv_usage_name("max"), f"max by ({_by(TOPOLOGY_BY)}) ({kv})"))
        rules.append(RecordingRule(kv_usage_name("avg"), f"avg by ({_by(TOPOLOGY_BY)}) ({kv})"))
        # Raw series are read over the shortest window only; the longer ones average its recordings.
        base = windows[0]
        for window in windows:
            source = None if window == base else base
            for metric in RATE_COUNTERS:
                raw = self.summed_rate(metric, window)
                rules.append(RecordingRule(rate_name(metric, window), self.averaged(
                    functools.partial(rate_name, metric), window, source, raw)))
            rules.append(RecordingRule(
                per_gpu_name(catalog.GENERATION_TOKENS, window),
                f"{rate_name(catalog.GENERATION_TOKENS, window)} / on (topology) group_left {GPUS_NAME}"))
            for metric in LATENCY_HISTOGRAMS:
                rules.extend(self.histogram_rules(metric, window, quantiles=window in dashboard_windows,
                                                  source=source))
            rules.extend(self.outcome_rates(window, source=source))
        return tuple(rules)

    @staticmethod
    def averaged(name_at: Callable[[str], str], window: str, source: str | None, raw: str) -> str:
        """The raw expression, or with a source window the average of its recording (`name_at`
        that window) over `window`: a rate over a window is the average of a shorter one's rates."""
        return raw if source is None else f"avg_over_time({name_at(source)}[{window}])"

    def histogram_rules(self, metric: Metric | KvFamily, window: str, quantiles: bool = True,
                        source: str | None = None) -> list[RecordingRule]:
        bucket = histogram_rate_name(metric, "bucket", window)
        count = histogram_rate_name(metric, "count", window)
        total = histogram_rate_name(metric, "sum", window)

        def part(name: str, suffix: str, by: tuple[str, ...] = TOPOLOGY_BY) -> str:
            raw = self.summed_rate(metric, window, by, suffix)
            return self.averaged(lambda w: histogram_rate_name(metric, name, w), window, source, raw)

        rules = [
            RecordingRule(bucket, part("bucket", "_bucket", (*TOPOLOGY_BY, "le"))),
            RecordingRule(count, part("count", "_count")),
            RecordingRule(total, part("sum", "_sum")),
        ]
        if not quantiles:
            return rules
        for quantile in slo.QUANTILES:
            rules.append(RecordingRule(quantile_name(metric, quantile, window),
                                       f"histogram_quantile({quantile}, {bucket})"))
        rules.append(RecordingRule(mean_name(metric, window), f"{total} / {count}"))
        return rules

    def fleet_requests(self, window: str, served: str, by: tuple[str, ...] = TOPOLOGY_BY) -> str:
        """The API server's requests the fleet should have served (slo.is_fleet_request). The
        counter has no model label: one spec serves one model, so it is added here. `served`: the
        recorded finished-requests rate of the same window and labels."""
        handlers = promql_string("|".join(re.escape(h) for h in slo.SERVING_HANDLERS))
        fleet = f"handler=~{handlers},status!={promql_string(slo.CLIENT_ERROR_STATUS)}"
        summed = self.summed_rate(catalog.HTTP_REQUESTS, window,
                                  tuple(label for label in by if label != "model_name"), extra=fleet)
        # vLLM creates the HTTP series at a handler's first response but the finished-reason series
        # at start: a 0 while the first is absent keeps the long windows' averages (avg_over_time of
        # these recordings) over the same samples, or a new series would look like lost requests.
        named = f'label_replace({summed}, "model_name", {promql_string(self.spec.model.name)}, "", "")'
        return f"{named} or on ({', '.join(by)}) (0 * {served})"

    def outcome_rates(self, window: str, level: str = "topology", by: tuple[str, ...] = TOPOLOGY_BY,
                      source: str | None = None, summed_from: str | None = None) -> list[RecordingRule]:
        """The raw rates of the outcome families (slo.OUTCOME_FAMILIES), each recorded once: read
        from the raw series, or with a source window averaged from its recordings, or with
        `summed_from` summed from that finer level's recordings of the same window."""
        by_reason = finished_by_reason_name(window, level)
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        served = rate_name(catalog.REQUEST_SUCCESS, window, level)
        api = api_requests_name(window, level)
        if summed_from is None:
            raw_finished = self.summed_rate(catalog.REQUEST_SUCCESS, window, (*by, "finished_reason"))
            raw_rejected = self.summed_rate(catalog.ADMISSION_REJECTIONS, window, by)
            raw_api = self.fleet_requests(window, served, by)
        else:
            def summed(finer: str, labels: tuple[str, ...] = by) -> str:
                return f"sum by ({_by(labels)}) ({finer})"

            raw_finished = summed(finished_by_reason_name(window, summed_from), (*by, "finished_reason"))
            raw_rejected = summed(rate_name(catalog.ADMISSION_REJECTIONS, window, summed_from))
            raw_api = summed(api_requests_name(window, summed_from))
        return [
            RecordingRule(by_reason, self.averaged(lambda w: finished_by_reason_name(w, level), window,
                                                   source, raw_finished)),
            RecordingRule(served, f"sum without (finished_reason) ({by_reason})"),
            RecordingRule(rejected, self.averaged(lambda w: rate_name(catalog.ADMISSION_REJECTIONS, w, level),
                                                  window, source, raw_rejected)),
            RecordingRule(api, self.averaged(lambda w: api_requests_name(w, level), window, source, raw_api)),
        ]

    def counted(self, window: str, level: str, by: tuple[str, ...]) -> str:
        """Requests the engine finished plus those rejected at admission (none without the family)."""
        finished = rate_name(catalog.REQUEST_SUCCESS, window, level)
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        return f"({finished} + on ({_by(by)}) ({rejected} or 0 * {finished}))"

    def unfinished_rule(self, window: str, level: str = "topology",
                        by: tuple[str, ...] = TOPOLOGY_BY) -> RecordingRule:
        """The API server's requests the engine never finished nor rejected (slo.UNFINISHED_REASON),
        over the longest raw window: the HTTP counter moves at the end of a response, a little after
        the engine's, and over a short window that gap alone would show healthy requests as unfinished.
        Absent without the HTTP family (none counted then)."""
        return RecordingRule(requests_name("unfinished", window, level),
                             f"clamp_min({api_requests_name(window, level)} - on ({_by(by)}) "
                             f"{self.counted(window, level, by)}, 0)")

    def outcome_rules(self, window: str, unfinished_window: str, level: str = "topology",
                      by: tuple[str, ...] = TOPOLOGY_BY) -> list[RecordingRule]:
        """slo.outcomes on the recorded rates: all requests are the finished, the rejected and the
        unfinished ones. A target without finished_reason counts every request as served (the
        fallback); one without the HTTP or admission family counts none there."""
        on = f"on ({_by(by)})"
        failed = f"finished_reason=~{promql_string('|'.join(slo.FAILED_REASONS))}"
        by_reason = finished_by_reason_name(window, level)
        finished = rate_name(catalog.REQUEST_SUCCESS, window, level)
        counted = self.counted(window, level, by)
        unfinished = requests_name("unfinished", unfinished_window, level)
        return [
            RecordingRule(requests_name("all", window, level),
                          f"{counted}\n+ {on} ({unfinished} or 0 * {finished})"),
            RecordingRule(requests_name("served", window, level),
                          f"sum without (finished_reason) ({by_reason}{{{failed.replace('=~', '!~')}}})"
                          f"\nor {on} 0 * {finished}"),
            RecordingRule(requests_name("failed_finished", window, level),
                          f"sum without (finished_reason) ({by_reason}{{{failed}}})\nor {on} 0 * {finished}"),
        ]

    def good_requests(self, bucket: SloBucket, window: str, level: str = "topology",
                      by: tuple[str, ...] = TOPOLOGY_BY) -> str:
        """Requests per second served within one SLO (slo.attainment x all requests), from the
        recorded bucket rates; 0, never NaN, so that long windows can average it."""
        on = f"on ({_by(by)})"
        within = f"sum by ({_by(by)}) ({histogram_rate_name(bucket.metric, 'bucket', window, level)}" \
                 f"{{{bucket.le_matcher}}})"
        if bucket.slo in slo.OBSERVES_FAILED:
            return f"clamp_min(\n  {within}\n  - {on} {requests_name('failed_finished', window, level)},\n0)"
        count = histogram_rate_name(bucket.metric, "count", window, level)
        return (f"{within}\n/ {on} ({count} > 0)\n* {on} {requests_name('served', window, level)}"
                f"\nor {on} 0 * {requests_name('all', window, level)}")

    def slo_rules(self, window: str, unfinished_window: str, level: str = "topology",
                  by: tuple[str, ...] = TOPOLOGY_BY,
                  kinds: tuple[str, ...] | None = None) -> list[RecordingRule]:
        """Outcomes, good requests and attainment per SLO over one window read from raw rates."""
        rules = self.outcome_rules(window, unfinished_window, level, by)
        every = requests_name("all", window, level)
        for bucket in self.buckets:
            if kinds is not None and bucket.slo not in kinds:
                continue
            good = good_requests_name(bucket.slo, window, level)
            rules.append(RecordingRule(good, self.good_requests(bucket, window, level, by)))
            rules.append(RecordingRule(attainment_name(bucket.slo, window, level),
                                       f"{good} / on ({_by(by)}) {every}"))
        return rules

    def replica_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """The outcome families per replica, and its failed requests by reason as the topology's
        are counted (failed_requests), for the dashboards' per-instance view. As per topology, raw
        series are read over the shortest window only; the longer ones average its recordings."""
        rules: list[RecordingRule] = []
        base = min(windows, key=parse_duration)
        for window in windows:
            rules.extend(self.outcome_rates(window, REPLICA_LEVEL, REPLICA_BY,
                                             source=None if window == base else base))
        longest = max(windows, key=parse_duration)
        rules.append(self.unfinished_rule(longest, REPLICA_LEVEL, REPLICA_BY))
        rules.extend(self.failed_requests(window, longest, REPLICA_LEVEL) for window in windows)
        return tuple(rules)

    def role_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """Request figures per P/D role: the decode side is what users see after the first token
        (its TTFT covers the KV-transfer wait), the prefill side the prefill work."""
        level = ROLE_LEVEL
        rules: list[RecordingRule] = []
        for window in windows:
            rules.extend(self.outcome_rates(window, level, ROLE_BY, summed_from=REPLICA_LEVEL))
        longest = max(windows, key=parse_duration)
        rules.append(self.unfinished_rule(longest, level, ROLE_BY))
        for window in windows:
            for metric in ROLE_COUNTERS:
                rules.append(RecordingRule(rate_name(metric, window, level),
                                           self.summed_rate(metric, window, ROLE_BY)))
            for metric in ROLE_HISTOGRAMS:
                bucket = histogram_rate_name(metric, "bucket", window, level)
                rules.append(RecordingRule(bucket, self.summed_rate(metric, window, (*ROLE_BY, "le"),
                                                                    "_bucket")))
                count = self.summed_rate(metric, window, ROLE_BY, "_count")
                rules.append(RecordingRule(histogram_rate_name(metric, "count", window, level), count))
                for quantile in slo.QUANTILES:
                    rules.append(RecordingRule(quantile_name(metric, quantile, window, level),
                                               f"histogram_quantile({quantile}, {bucket})"))
            rules.extend(self.slo_rules(window, longest, level, ROLE_BY, slo.PER_REQUEST_SLOS))
        return tuple(rules)

    def goodput_rules(self, raw_windows: tuple[str, ...],
                      dashboard_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = []
        request_slos = request_slo_buckets(self.buckets)
        rules.append(self.unfinished_rule(raw_windows[-1]))
        for window in raw_windows:
            rules.extend(self.slo_rules(window, raw_windows[-1]))
            rules.extend(self.sli_errors(window))
        for window in dashboard_windows:
            rules.append(self.failed_requests(window, raw_windows[-1]))
            if request_slos:
                names = [attainment_name(b.slo, window) for b in request_slos]
                # Frechet bounds on "every SLO met" from the per-SLO shares.
                lower = " + ".join(names)
                rules.append(RecordingRule(joint_attainment_name("lower", window),
                                           f"clamp_min({lower} - {len(names) - 1}, 0)"))
                upper = " or ".join(f'label_replace({n}, "slo", "{b.slo}", "", "")'
                                    for n, b in zip(names, request_slos, strict=True))
                rules.append(RecordingRule(joint_attainment_name("upper", window),
                                           f"min without (slo) ({upper})"))
                rules.append(RecordingRule(
                    goodput_requests_name(window),
                    f"{requests_name('all', window)} * {joint_attainment_name('lower', window)}"))
                rules.append(RecordingRule(
                    goodput_tokens_name(window),
                    f"{rate_name(catalog.GENERATION_TOKENS, window)}"
                    f" * {joint_attainment_name('lower', window)}"))
                rules.append(RecordingRule(
                    goodput_tokens_name(window, per_gpu=True),
                    f"{goodput_tokens_name(window)} / on (topology) group_left {GPUS_NAME}"))
        for bucket in self.buckets:
            labels = (("slo", bucket.slo),)
            rules.append(RecordingRule(OBJECTIVE_NAME, f"vector({self.spec.slos.objective!r})", labels))
        return tuple(rules)

    def sli_errors(self, window: str) -> list[RecordingRule]:
        return [RecordingRule(sli_error_name(window), f"1 - {attainment_name(b.slo, window)}",
                              (("slo", b.slo),)) for b in self.buckets]

    def long_window_rules(self, raw_windows: tuple[str, ...],
                          long_windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        """Each longer SLI window from the recordings of a window at most a twentieth as long (so it
        reaches at most 5% further back), the longest such: good and all requests are rates, and
        the average of a short window's rates over the long window is the long window's rate."""
        rules: list[RecordingRule] = []
        recorded = [parse_duration(w) for w in raw_windows]
        on = f"on ({_by(TOPOLOGY_BY)})"
        for window in long_windows:
            seconds = parse_duration(window)
            source = format_duration(max([w for w in recorded if w <= seconds / 20] or [min(recorded)]))
            every = requests_name("all", window)
            rules.append(RecordingRule(every, f"avg_over_time({requests_name('all', source)}[{window}])"))
            for bucket in self.buckets:
                good = good_requests_name(bucket.slo, window)
                rules.append(RecordingRule(
                    good, f"avg_over_time({good_requests_name(bucket.slo, source)}[{window}])"))
                rules.append(RecordingRule(attainment_name(bucket.slo, window), f"{good} / {on} {every}"))
            rules.extend(self.sli_errors(window))
            recorded.append(seconds)
        period = format_duration(self.period_s)
        rules.append(RecordingRule(
            BUDGET_REMAINING_NAME,
            f"1 - {sli_error_name(period)} / {error_budget(self.spec)!r}"))
        return tuple(rules)

    def failed_requests(self, window: str, unfinished_window: str, level: str = "topology") -> RecordingRule:
        """Failed requests/s by reason (slo.FAILURE_REASONS): abort and error (finished_reason),
        rejected (admission), unfinished (over the longest raw window), from the recordings."""
        failed = promql_string("|".join(slo.FAILED_REASONS))
        by_reason = f"{finished_by_reason_name(window, level)}{{finished_reason=~{failed}}}"
        rejected = rate_name(catalog.ADMISSION_REJECTIONS, window, level)
        unfinished = requests_name("unfinished", unfinished_window, level)
        relabelled = f'label_replace({by_reason}, "reason", "$1", "finished_reason", "(.*)")'
        return RecordingRule(failed_requests_name(window, level), (
            f"sum without (finished_reason) ({relabelled})\n"
            f'or\nlabel_replace({rejected}, "reason", {promql_string(slo.REJECTED_REASON)}, "", "")\n'
            f'or\nlabel_replace({unfinished}, "reason", {promql_string(slo.UNFINISHED_REASON)}, "", "")'))

    def kv_rules(self, windows: tuple[str, ...]) -> tuple[RecordingRule, ...]:
        rules: list[RecordingRule] = []
        for window in windows:
            for family in KV_HISTOGRAMS:
                rules.extend(self.histogram_rules(family, window))
            rules.append(RecordingRule(rate_name(KV_FAILURES, window),
                                       self.summed_rate(KV_FAILURES, window)))
            rules.append(RecordingRule(
                kv_bandwidth_name(window),
                f"{histogram_rate_name(KV_BYTES, 'sum', window)}\n/\n"
                f"{histogram_rate_name(KV_TIME, 'sum', window)}"))
        return tuple(rules)

    def slo_alerts(self) -> tuple[AlertRule, ...]:
        alerts: list[AlertRule] = []
        budget = error_budget(self.spec)
        for tier in self.tiers:
            threshold = f"({tier.factor!r} * {budget!r})"
            expr = (f"{sli_error_name(tier.long)} > {threshold}\n"
                    f"and\n{sli_error_name(tier.short)} > {threshold}")
            alerts.append(AlertRule(
                BURN_ALERT, expr, tier.for_s, tier.severity,
                summary="Topology {{ $labels.topology }} burns its {{ $labels.slo }} error budget "
                        f"{tier.factor:g}x too fast",
                description=f"Over both {tier.long} and {tier.short}, more than {tier.factor:g} x "
                            f"{budget * 100:g}% of {{{{ $labels.model_name }}}} requests on topology "
                            "{{ $labels.topology }} missed the {{ $labels.slo }} SLO; at this rate "
                            f"{tier.budget_share * 100:g}% of the {format_duration(self.period_s)} "
                            f"error budget is gone within {tier.long}.",
                runbook_url=self.runbook(BURN_ALERT),
                labels=(("long_window", tier.long),)))
        alerts.append(AlertRule(
            "VllmErrorBudgetExhausted", f"{BUDGET_REMAINING_NAME} <= 0", 0.0, "warning",
            summary="Topology {{ $labels.topology }} has spent its {{ $labels.slo }} error budget",
            description=f"Over the last {format_duration(self.period_s)} more than {budget * 100:g}% of "
                        "requests on topology {{ $labels.topology }} missed the {{ $labels.slo }} SLO.",
            runbook_url=self.runbook("VllmErrorBudgetExhausted")))
        return tuple(alerts)

    def fleet_alerts(self) -> tuple[AlertRule, ...]:
        """Alerts on the fleet itself: targets down or missing, metric families or SLO buckets missing,
        the entrypoint without request metrics, slow or failing KV transfers."""
        return (*self.target_alerts(), self.metrics_absent_alert(), self.slo_bucket_missing_alert(),
                *self.entrypoint_alerts(), *self.kv_transfer_alerts())

    def _vllm_up(self) -> str:
        return self.sel("up", NOT_ENTRYPOINT)  # vLLM instances; an entrypoint serves no engine families

    def target_alerts(self) -> tuple[AlertRule, ...]:
        up = self._vllm_up()
        scaled = self.config.window_scale
        return (
            AlertRule(
                "VllmTargetDown", f"{up} == 0", float(round(60 * scaled)), "warning",
                summary="vLLM instance {{ $labels.instance }} of topology {{ $labels.topology }} is down",
                description="Prometheus cannot scrape {{ $labels.instance }} (topology "
                            "{{ $labels.topology }}, role {{ $labels.role }}): the instance is down or its "
                            "/metrics does not answer.",
                runbook_url=self.runbook("VllmTargetDown")),
            AlertRule(
                "VllmTopologyDown", f"max by (topology) ({up}) == 0", float(round(60 * scaled)), "critical",
                summary="Every instance of topology {{ $labels.topology }} is down",
                description="No instance of topology {{ $labels.topology }} answers scrapes: it serves "
                            "no traffic and its goodput cannot be measured.",
                runbook_url=self.runbook("VllmTopologyDown")),
            AlertRule(
                "VllmTopologyAbsent",
                "\nor\n".join(
                    f'max by (topology) (absent({self.sel("up", "topology=" + promql_string(t.name))}))'
                    for t in self.spec.topologies),
                # At least four scrapes: a freshly started Prometheus evaluates before its first scrape.
                float(max(round(300 * scaled), math.ceil(4 * self.spec.scrape.interval_seconds))), "critical",
                summary="Prometheus scrapes no target of topology {{ $labels.topology }}",
                description="No target of topology {{ $labels.topology }} exists in Prometheus at all (not "
                            "down: not discovered). The scrape config, the PodMonitor's pod labels "
                            "(crossover.vllm.io/topology) or --selector do not match the fleet, so every "
                            "other alert about this topology stays silent.",
                runbook_url=self.runbook("VllmTopologyAbsent")),
        )

    def metrics_absent_alert(self) -> AlertRule:
        up = self._vllm_up()
        scaled = self.config.window_scale
        absent = []
        for metric in WATCHED_FAMILIES:
            absent.append(f'label_replace(({up} == 1) unless on (instance) {self.sel(metric.presence_name)}, '
                          f'"metric", "{metric.name}", "", "")')
        return AlertRule(
            "VllmMetricsAbsent", "\nor\n".join(absent), float(round(300 * scaled)), "warning",
            summary="{{ $labels.instance }} is up but exposes no {{ $labels.metric }}",
            description="The target answers scrapes but lacks {{ $labels.metric }}: vLLM probably renamed "
                        "it (see crossover/catalog.py aliases); rules and dashboards built on it show "
                        "no data.",
            runbook_url=self.runbook("VllmMetricsAbsent"))

    def slo_bucket_missing_alert(self) -> AlertRule:
        scaled = self.config.window_scale
        missing = []
        for bucket in self.buckets:
            count = self.sel(bucket.metric.presence_name)
            good = self.sel(bucket.metric.name + "_bucket", bucket.le_matcher)
            missing.append(f'label_replace({count} unless on (instance) {good}, '
                           f'"slo", "{bucket.slo}", "", "")')
        return AlertRule(
            "VllmSloBucketMissing", "\nor\n".join(missing), float(round(300 * scaled)), "warning",
            summary="{{ $labels.instance }} has no histogram bucket at the {{ $labels.slo }} SLO",
            description="The target exposes the histogram but no bucket whose boundary is the SLO threshold "
                        "(custom --custom-histogram-buckets?): goodput for {{ $labels.slo }} cannot be "
                        "computed there. Regenerate the rules for the target's buckets.",
            runbook_url=self.runbook("VllmSloBucketMissing"))

    def entrypoint_alerts(self) -> tuple[AlertRule, ...]:
        if not any(t.entrypoint.metrics_url for t in self.spec.topologies):
            return ()
        return (AlertRule(
            "VllmEntrypointMetricsAbsent",
            f"({self.sel('up', ENTRYPOINT_MATCHER)} == 1)\nunless on (instance)\n"
            f"count by (instance) ({self.entrypoint_request_series()})",
            float(round(300 * self.config.window_scale)), "warning",
            summary="The entrypoint of topology {{ $labels.topology }} exposes no request metrics",
            description="The entrypoint target {{ $labels.instance }} answers scrapes but exposes none "
                        "of vLLM's request families, so the topology's request figures fall back to "
                        "its decode role: decode-side, TTFT excludes the prefill.",
            runbook_url=self.runbook("VllmEntrypointMetricsAbsent")),)

    def kv_transfer_alerts(self) -> tuple[AlertRule, ...]:
        if not any(t.disaggregated for t in self.spec.topologies):
            return ()
        scaled = self.config.window_scale
        threshold_s = self.config.kv_transfer_p99_ms / 1000.0
        return (
            AlertRule(
                "VllmKvTransferSlow",
                f"{quantile_name(KV_TIME, 0.99, self.kv_window)} > {threshold_s!r}",
                float(round(300 * scaled)), "warning",
                summary="KV transfers of topology {{ $labels.topology }} are slow (p99 over "
                        f"{self.config.kv_transfer_p99_ms:g} ms)",
                description=f"The p99 KV-transfer time (NIXL or Mooncake) over {self.kv_window} exceeds "
                            f"{self.config.kv_transfer_p99_ms:g} ms; decode instances wait on the prefill "
                            "side and TTFT grows.",
                runbook_url=self.runbook("VllmKvTransferSlow")),
            AlertRule(
                "VllmKvTransferFailures",
                f"{rate_name(KV_FAILURES, self.kv_window)} > 0",
                float(round(60 * scaled)), "critical",
                summary="KV transfers of topology {{ $labels.topology }} are failing",
                description="The KV connector reports failed KV-cache transfers over the last "
                            f"{self.kv_window}; the "
                            "affected requests are recomputed or aborted.",
                runbook_url=self.runbook("VllmKvTransferFailures")),
        )

def disaggregated_topologies(spec: FleetSpec) -> tuple[str, ...]:
    return tuple(t.name for t in spec.topologies if any(i.role is not Role.COLOCATED for i in t.instances))
