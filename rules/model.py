"""Spec -> a small plain-data model of Prometheus recording rules and alerts.

Everything that later becomes YAML (rules, the PrometheusRule resource, the promtool unit tests)
and every recording-rule name a dashboard queries comes from `build_rules`, so rules, tests and
dashboards cannot drift apart. This module holds the model (RuleSet, its groups, the generator's
knobs) and `build_rules`, which picks the windows and puts what the other modules build in groups:

  names.py        every name the rules give (recording rules, levels, alerts' runbook links)
  buckets.py      which histogram bucket each SLO reads, and its `le` matcher
  raw_series.py   how every rule reads vLLM's raw series (the selector, the roles users see)
  recording.py    the recording rules (RecordingRules)
  alerts.py       the burn-rate tiers and the alerts (Alerts)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from crossover.errors import UserError
from crossover.kube import JOB_NAME
from crossover.rules.alerts import AlertRule, Alerts, BurnTier, burn_tiers, round_window, unreachable_tiers
from crossover.rules.buckets import SloBucket, slo_buckets
from crossover.rules.raw_series import RawSeries
from crossover.rules.recording import RecordingRule, RecordingRules
from crossover.spec import FleetSpec, format_duration

DEFAULT_SELECTOR = f'job="{JOB_NAME}"'


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


def disaggregated_topologies(spec: FleetSpec) -> tuple[str, ...]:
    return tuple(t.name for t in spec.topologies if t.disaggregated)


def build_rules(spec: FleetSpec, config: RulesConfig | None = None, source: str = "spec") -> RuleSet:
    config = config or RulesConfig()
    buckets, warnings = slo_buckets(spec, config.refuse_off_boundary, source)
    period_s = float(round(spec.slos.period_seconds * config.window_scale))
    interval_s = spec.scrape.interval_seconds
    floor_s = 4 * interval_s
    tiers = burn_tiers(period_s, spec.slos.objective, interval_s)
    warnings = (*warnings, *unreachable_tiers(tiers, spec.slos.objective, source))
    kv_window = format_duration(round_window(300.0 * config.window_scale, floor_s))
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
    raw = RawSeries(config.selector)
    budget = error_budget(spec)
    recording = RecordingRules(spec, raw, buckets, period_s, budget)
    alerts = Alerts(spec, config, raw, buckets, tiers, period_s, kv_window, budget)
    groups = (
        # One group from raw rates to attainment: every recording it reads is of the same evaluation.
        RuleGroup("crossover-topology", (*recording.topology_rules(raw_windows, dashboard_windows),
                                         *recording.goodput_rules(raw_windows, dashboard_windows)), fast_s),
        RuleGroup("crossover-slo-windows", recording.long_window_rules(
            raw_windows, tuple(w for w in sli_windows if w not in raw_windows)), long_s),
        # Per replica, then (P/D fleets) per role summed from the replicas' recordings of this evaluation.
        RuleGroup("crossover-replicas", (*recording.replica_rules(dashboard_windows),
                                         *(recording.role_rules(dashboard_windows)
                                           if disaggregated_topologies(spec) else ())), fast_s),
        RuleGroup("crossover-kv-transfer", recording.kv_rules(tuple(dict.fromkeys((*dashboard_windows,
                                                                                     kv_window)))), fast_s),
        RuleGroup("crossover-slo-alerts", alerts.slo_alerts(), fast_s),
        RuleGroup("crossover-fleet-alerts", alerts.fleet_alerts(), fast_s),
    )
    return RuleSet(spec, config, groups, buckets, tiers, dashboard_windows, sli_windows,
                   format_duration(period_s), kv_window, warnings)
