"""The prometheus_client custom collector: the latest Snapshot as crossover_* families.

Families, names and labels come from crossover.exporter.names; a derived value that is None (the
targets lack the family) is left out, so the series is absent rather than zero.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from crossover import slo
from crossover.exporter import names
from crossover.exporter.derive import Derived, Latency
from crossover.exporter.state import GroupView, Snapshot

Row = tuple[str, tuple[str, ...], float]  # (series suffix, extra label values, value)


def _latency_rows(short: str, latency: Latency | None) -> Iterator[Row]:
    if latency is None:
        return
    for quantile, value in latency.quantiles.items():
        yield f"{short}_seconds", (quantile,), value
    yield f"{short}_mean_seconds", (), latency.mean
    yield f"{short}_observations", (), latency.observations


def derived_rows(derived: Derived) -> Iterator[Row]:
    """Every (suffix, extra labels, value) of one Derived; None values are skipped."""
    for short in slo.SLO_KINDS:
        yield from _latency_rows(short, derived.latency.get(short))
    scalars: dict[str, float | None] = {
        "prompt_tokens_per_second": derived.prompt_tokens_per_second,
        "prompt_tokens_per_second_per_gpu": derived.prompt_tokens_per_second_per_gpu,
        "generation_tokens_per_second": derived.generation_tokens_per_second,
        "generation_tokens_per_second_per_gpu": derived.generation_tokens_per_second_per_gpu,
        "requests_per_second": derived.requests_per_second,
        "requests_per_second_per_gpu": derived.requests_per_second_per_gpu,
        "kv_cache_usage_max_ratio": derived.kv_cache_usage_max,
        "kv_cache_usage_mean_ratio": derived.kv_cache_usage_mean,
        "requests_running": derived.running,
        "requests_waiting": derived.waiting,
        "preemptions_per_second": derived.preemptions_per_second,
        "preemptions_per_request": derived.preemptions_per_request,
        f"{slo.ATTAINMENT}_lower_ratio": derived.attainment_lower,
        f"{slo.ATTAINMENT}_upper_ratio": derived.attainment_upper,
        f"{slo.GOODPUT_REQUESTS}_lower": derived.goodput_requests_per_second_lower,
        f"{slo.GOODPUT_REQUESTS}_upper": derived.goodput_requests_per_second_upper,
        f"{slo.GOODPUT_TOKENS}_lower": derived.goodput_tokens_per_second_lower,
        f"{slo.GOODPUT_TOKENS}_upper": derived.goodput_tokens_per_second_upper,
        f"{slo.GOODPUT_TOKENS}_per_gpu_lower": derived.goodput_tokens_per_second_per_gpu_lower,
        f"{slo.GOODPUT_TOKENS}_per_gpu_upper": derived.goodput_tokens_per_second_per_gpu_upper,
        "window_targets": float(derived.targets),
        "gpus": float(derived.gpus),
    }
    kv = derived.kv_transfer
    if kv is not None:
        yield from _latency_rows("kv_transfer", kv.time)
        scalars.update({
            "kv_transfers_per_second": kv.transfers_per_second,
            "kv_transfer_bytes_per_second": kv.bytes_per_second,
            "kv_transfer_bandwidth_bytes_per_second": kv.bytes_per_transfer_second,
            "kv_transfer_failures_per_second": kv.failures_per_second,
        })
    for suffix, value in scalars.items():
        if value is not None:
            yield suffix, (), value
    for reason, rate in derived.requests_per_second_by_reason.items():
        yield "finished_requests_per_second", (reason,), rate
    for reason, rate in derived.failed_requests_per_second.items():
        yield slo.FAILED_REQUESTS, (reason,), rate
    if derived.failures_counted is not None:
        yield slo.FAILURES_COUNTED, (), 1.0 if derived.failures_counted else 0.0
    for kind, attainment in derived.attainment.items():
        yield f"{slo.ATTAINMENT}_ratio", (kind,), attainment.ratio
        yield "slo_threshold_seconds", (kind,), attainment.threshold_seconds
        yield f"{slo.ATTAINMENT}_exact", (kind,), 1.0 if attainment.exact else 0.0


def _level_labels(level: str, view: GroupView) -> tuple[str, ...]:
    if level == "topology":
        return (view.topology,)
    if level == "role":
        return (view.topology, view.role or "")
    return (view.topology, view.instance or "", view.role or "")


class SnapshotCollector(Collector):
    """Reads the latest Snapshot through `current()` on each collect (thread-safe: snapshots are
    immutable and replaced whole)."""

    def __init__(self, current: Callable[[], Snapshot]) -> None:
        self.current = current

    def describe(self) -> list[Metric]:
        return []  # families vary with the spec; no up-front description (no auto-describe either)

    def collect(self) -> Iterator[Metric]:
        snapshot = self.current()
        families: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        family_labels: dict[str, tuple[str, ...]] = {}
        for metric in names.EXPORTED_METRICS:
            family_labels[metric.name] = metric.labels
            if metric.type == "counter":
                families[metric.name] = CounterMetricFamily(metric.name.removesuffix("_total"), metric.help,
                                                            labels=metric.labels)
            else:
                families[metric.name] = GaugeMetricFamily(metric.name, metric.help, labels=metric.labels)
        prefix = names.PREFIX
        for target in snapshot.targets:
            labels = [target.topology, target.instance, target.role]
            families[f"{prefix}_target_up"].add_metric(labels, 1.0 if target.up else 0.0)
            families[f"{prefix}_scrapes_total"].add_metric(labels, float(target.scrapes))
            if target.scrape_duration_seconds is not None:
                duration = target.scrape_duration_seconds
                families[f"{prefix}_scrape_duration_seconds"].add_metric(labels, duration)
            if target.last_success_timestamp is not None:
                families[f"{prefix}_scrape_body_bytes"].add_metric(labels, float(target.body_bytes))
            for reason, count in target.errors.items():
                families[f"{prefix}_scrape_errors_total"].add_metric([*labels, reason], float(count))
        families[f"{prefix}_exporter_cycle_seconds"].add_metric([], snapshot.cycle_seconds)
        families[f"{prefix}_exporter_targets"].add_metric([], float(len(snapshot.targets)))
        for result in ("ok", "error"):
            families[f"{prefix}_exporter_spec_reloads_total"].add_metric(
                [result], float(snapshot.spec_reloads.get(result, 0)))
        for level, views in (("topology", snapshot.topologies), ("role", snapshot.roles),
                             ("instance", snapshot.instances)):
            for view in views:
                base = _level_labels(level, view)
                for window, derived in view.windows.items():
                    if level == "topology" and derived.requests_source is not None:
                        source = derived.requests_source
                        families[names.REQUESTS_SOURCE].add_metric([*base, window, source], 1.0)
                    for suffix, extra, value in derived_rows(derived):
                        families[names.derived_name(level, suffix)].add_metric([*base, window, *extra], value)
        for view in snapshot.splits:
            # Split series join the topology's own families with one more label, beside the unsplit
            # series (kept as they were): a query selects the unsplit ones with {label=""}.
            assert view.split is not None
            split_label, split_value = view.split
            for window, derived in view.windows.items():
                for suffix, extra, number in derived_rows(derived):
                    if suffix not in names.SPLIT_SUFFIXES:
                        continue
                    family = families[names.derived_name("topology", suffix)]
                    base = (view.topology, window, *extra)
                    named = dict(zip(family_labels[family.name], base, strict=True))
                    family.add_sample(family.name, {**named, split_label: split_value}, number)
        for family in families.values():
            if family.samples:
                yield family
