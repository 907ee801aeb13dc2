"""The alerts: multi-window multi-burn-rate alerts on each SLO's error budget (the SRE workbook's
table, scaled to the spec's period), and alerts on the fleet itself (targets down or absent, metric
families or SLO buckets missing, the entrypoint without request metrics, slow or failing KV
transfers). Each alert's runbook is its section of docs/runbooks.md (names.runbook_url).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from crossover import catalog
from crossover.catalog import Metric
from crossover.rules.buckets import SloBucket
from crossover.rules.names import (
    BUDGET_REMAINING_NAME,
    BURN_ALERT,
    KV_FAILURES,
    KV_TIME,
    quantile_name,
    rate_name,
    runbook_url,
    sli_error_name,
)
from crossover.rules.raw_series import ENTRYPOINT_MATCHER, RawSeries, promql_string
from crossover.spec import FleetSpec, format_duration

if TYPE_CHECKING:
    from crossover.rules.model import RulesConfig

# Families whose absence on an up target means a vLLM rename (or a broken exporter of them).
WATCHED_FAMILIES: tuple[Metric, ...] = (
    catalog.GENERATION_TOKENS, catalog.PROMPT_TOKENS, catalog.REQUEST_SUCCESS, catalog.NUM_PREEMPTIONS,
    catalog.NUM_REQUESTS_RUNNING, catalog.NUM_REQUESTS_WAITING, catalog.KV_CACHE_USAGE,
    catalog.TTFT, catalog.TPOT, catalog.ITL, catalog.E2E_LATENCY,
)


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


# ---- burn-rate tiers -------------------------------------------------------------------------

REFERENCE_PERIOD_S = 30 * 86400.0  # the SRE workbook's burn table is written for 30 days
# Google SRE workbook / Sloth / kubernetes-mixin, for a 30-day period: (severity, long, short, share, for).
REFERENCE_TIERS: tuple[tuple[str, float, float, float, float], ...] = (
    ("critical", 3600.0, 300.0, 0.02, 120.0),
    ("critical", 6 * 3600.0, 1800.0, 0.05, 900.0),
    ("warning", 86400.0, 2 * 3600.0, 0.10, 3600.0),
    ("warning", 3 * 86400.0, 6 * 3600.0, 0.10, 3 * 3600.0),
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


def round_window(seconds: float, floor_s: float) -> float:
    """Whole seconds, and at least four scrapes so rate() always sees two samples or more."""
    return float(max(round(seconds), math.ceil(floor_s)))


def burn_tiers(period_s: float, objective: float, scrape_interval_s: float) -> tuple[BurnTier, ...]:
    """Scale the 30-day table to the period (as Pyrra does) and compute each factor from it."""
    scale = period_s / REFERENCE_PERIOD_S
    floor = 4 * scrape_interval_s
    tiers = []
    for severity, long_s, short_s, share, for_s in REFERENCE_TIERS:
        long_w = round_window(long_s * scale, floor)
        short_w = round_window(short_s * scale, floor)
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


# ---- the alerts ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Alerts:
    """Builds the alerts of one spec; model.build_rules puts them in their groups."""

    spec: FleetSpec
    config: RulesConfig
    raw: RawSeries
    buckets: tuple[SloBucket, ...]  # the SLOs' buckets (buckets.slo_buckets)
    tiers: tuple[BurnTier, ...]
    period_s: float  # the (possibly scaled) SLO period
    kv_window: str  # the window of the KV-transfer alerts
    budget: float  # the error budget, 1 - objective (model.error_budget)

    def alert(self, name: str, expr: str, for_s: float, severity: str, *, summary: str, description: str,
              labels: tuple[tuple[str, str], ...] = ()) -> AlertRule:
        """One alert, its runbook link made from its name."""
        return AlertRule(name, expr, for_s, severity, summary, description,
                         runbook_url(self.config.runbook_base, name), labels)

    def slo_alerts(self) -> tuple[AlertRule, ...]:
        alerts: list[AlertRule] = []
        for tier in self.tiers:
            threshold = f"({tier.factor!r} * {self.budget!r})"
            expr = (f"{sli_error_name(tier.long)} > {threshold}\n"
                    f"and\n{sli_error_name(tier.short)} > {threshold}")
            alerts.append(self.alert(
                BURN_ALERT, expr, tier.for_s, tier.severity,
                summary="Topology {{ $labels.topology }} burns its {{ $labels.slo }} error budget "
                        f"{tier.factor:g}x too fast",
                description=f"Over both {tier.long} and {tier.short}, more than {tier.factor:g} x "
                            f"{self.budget * 100:g}% of {{{{ $labels.model_name }}}} requests on topology "
                            "{{ $labels.topology }} missed the {{ $labels.slo }} SLO; at this rate "
                            f"{tier.budget_share * 100:g}% of the {format_duration(self.period_s)} "
                            f"error budget is gone within {tier.long}.",
                labels=(("long_window", tier.long),)))
        alerts.append(self.alert(
            "VllmErrorBudgetExhausted", f"{BUDGET_REMAINING_NAME} <= 0", 0.0, "warning",
            summary="Topology {{ $labels.topology }} has spent its {{ $labels.slo }} error budget",
            description=f"Over the last {format_duration(self.period_s)} more than {self.budget * 100:g}% of "
                        "requests on topology {{ $labels.topology }} missed the {{ $labels.slo }} SLO."))
        return tuple(alerts)

    def fleet_alerts(self) -> tuple[AlertRule, ...]:
        """Alerts on the fleet itself: targets down or missing, metric families or SLO buckets missing,
        the entrypoint without request metrics, slow or failing KV transfers."""
        return (*self.target_alerts(), self.metrics_absent_alert(), self.slo_bucket_missing_alert(),
                *self.entrypoint_alerts(), *self.kv_transfer_alerts())

    def target_alerts(self) -> tuple[AlertRule, ...]:
        up = self.raw.vllm_up()
        scaled = self.config.window_scale
        return (
            self.alert(
                "VllmTargetDown", f"{up} == 0", float(round(60 * scaled)), "warning",
                summary="vLLM instance {{ $labels.instance }} of topology {{ $labels.topology }} is down",
                description="Prometheus cannot scrape {{ $labels.instance }} (topology "
                            "{{ $labels.topology }}, role {{ $labels.role }}): the instance is down or its "
                            "/metrics does not answer."),
            self.alert(
                "VllmTopologyDown", f"max by (topology) ({up}) == 0", float(round(60 * scaled)), "critical",
                summary="Every instance of topology {{ $labels.topology }} is down",
                description="No instance of topology {{ $labels.topology }} answers scrapes: it serves "
                            "no traffic and its goodput cannot be measured."),
            self.alert(
                "VllmTopologyAbsent",
                "\nor\n".join(
                    f'max by (topology) (absent({self.raw.sel("up", "topology=" + promql_string(t.name))}))'
                    for t in self.spec.topologies),
                # At least four scrapes: a freshly started Prometheus evaluates before its first scrape.
                float(max(round(300 * scaled), math.ceil(4 * self.spec.scrape.interval_seconds))), "critical",
                summary="Prometheus scrapes no target of topology {{ $labels.topology }}",
                description="No target of topology {{ $labels.topology }} exists in Prometheus at all (not "
                            "down: not discovered). The scrape config, the PodMonitor's pod labels "
                            "(crossover.vllm.io/topology) or --selector do not match the fleet, so every "
                            "other alert about this topology stays silent."),
        )

    def metrics_absent_alert(self) -> AlertRule:
        up = self.raw.vllm_up()
        scaled = self.config.window_scale
        absent = []
        for metric in WATCHED_FAMILIES:
            present = self.raw.sel(metric.presence_name)
            absent.append(f'label_replace(({up} == 1) unless on (instance) {present}, '
                          f'"metric", "{metric.name}", "", "")')
        return self.alert(
            "VllmMetricsAbsent", "\nor\n".join(absent), float(round(300 * scaled)), "warning",
            summary="{{ $labels.instance }} is up but exposes no {{ $labels.metric }}",
            description="The target answers scrapes but lacks {{ $labels.metric }}: vLLM probably renamed "
                        "it (see crossover/catalog.py aliases); rules and dashboards built on it show "
                        "no data.")

    def slo_bucket_missing_alert(self) -> AlertRule:
        scaled = self.config.window_scale
        missing = []
        for bucket in self.buckets:
            count = self.raw.sel(bucket.metric.presence_name)
            good = self.raw.sel(bucket.metric.name + "_bucket", bucket.le_matcher)
            missing.append(f'label_replace({count} unless on (instance) {good}, '
                           f'"slo", "{bucket.slo}", "", "")')
        return self.alert(
            "VllmSloBucketMissing", "\nor\n".join(missing), float(round(300 * scaled)), "warning",
            summary="{{ $labels.instance }} has no histogram bucket at the {{ $labels.slo }} SLO",
            description="The target exposes the histogram but no bucket whose boundary is the SLO threshold "
                        "(custom --custom-histogram-buckets?): goodput for {{ $labels.slo }} cannot be "
                        "computed there. Regenerate the rules for the target's buckets.")

    def entrypoint_alerts(self) -> tuple[AlertRule, ...]:
        if not any(t.entrypoint.scraped for t in self.spec.topologies):
            return ()
        return (self.alert(
            "VllmEntrypointMetricsAbsent",
            f"({self.raw.sel('up', ENTRYPOINT_MATCHER)} == 1)\nunless on (instance)\n"
            f"count by (instance) ({self.raw.entrypoint_request_series()})",
            float(round(300 * self.config.window_scale)), "warning",
            summary="The entrypoint of topology {{ $labels.topology }} exposes no request metrics",
            description="The entrypoint target {{ $labels.instance }} answers scrapes but exposes none "
                        "of vLLM's request families, so the topology's request figures fall back to "
                        "its decode role: decode-side, TTFT excludes the prefill."),)

    def kv_transfer_alerts(self) -> tuple[AlertRule, ...]:
        if not any(t.disaggregated for t in self.spec.topologies):
            return ()
        scaled = self.config.window_scale
        threshold_s = self.config.kv_transfer_p99_ms / 1000.0
        return (
            self.alert(
                "VllmKvTransferSlow",
                f"{quantile_name(KV_TIME, 0.99, self.kv_window)} > {threshold_s!r}",
                float(round(300 * scaled)), "warning",
                summary="KV transfers of topology {{ $labels.topology }} are slow (p99 over "
                        f"{self.config.kv_transfer_p99_ms:g} ms)",
                description=f"The p99 KV-transfer time (NIXL or Mooncake) over {self.kv_window} exceeds "
                            f"{self.config.kv_transfer_p99_ms:g} ms; decode instances wait on the prefill "
                            "side and TTFT grows."),
            self.alert(
                "VllmKvTransferFailures",
                f"{rate_name(KV_FAILURES, self.kv_window)} > 0",
                float(round(60 * scaled)), "critical",
                summary="KV transfers of topology {{ $labels.topology }} are failing",
                description="The KV connector reports failed KV-cache transfers over the last "
                            f"{self.kv_window}; the "
                            "affected requests are recomputed or aborted."),
        )
