"""Every series the exporter serves on /metrics: names, types, labels and help, in one list.

The collector builds its families from this list and docs/exporter.md's table is generated from it
(a test fails when the committed table differs), so dashboards and rules can import
`EXPORTED_METRICS` instead of spelling names.

Derived series exist at three levels, each its own name prefix so a query never mixes them:
`crossover_topology_*` (the topology as its users see it: request figures from its entrypoint, or
from its decode role when a P/D topology has no entrypoint metrics; never both roles' requests),
`crossover_role_*` (sum over a P/D topology's prefill, decode or entrypoint targets) and
`crossover_instance_*`.
"""

from __future__ import annotations

from dataclasses import dataclass

from crossover import catalog, slo

PREFIX = "crossover"

LEVELS: tuple[str, ...] = ("topology", "role", "instance")
LEVEL_LABELS: dict[str, tuple[str, ...]] = {
    "topology": ("topology",),
    "role": ("topology", "role"),
    "instance": ("topology", "instance", "role"),
}
TARGET_LABELS: tuple[str, ...] = ("topology", "instance", "role")


@dataclass(frozen=True)
class ExportedMetric:
    name: str  # as exposed (counters carry `_total`)
    type: str  # "gauge" or "counter"
    help: str
    labels: tuple[str, ...]


@dataclass(frozen=True)
class DerivedSeries:
    """One derived series, before its level prefix is added."""

    suffix: str
    help: str
    extra_labels: tuple[str, ...] = ()


def _latency(short: str, what: str) -> list[DerivedSeries]:
    return [
        DerivedSeries(f"{short}_seconds", f"{what}: quantile over the window, as histogram_quantile "
                      "over the summed bucket increases.", ("quantile",)),
        DerivedSeries(f"{short}_mean_seconds",
                      f"{what}: mean over the window, increase(sum)/increase(count)."),
        DerivedSeries(f"{short}_observations", f"{what}: observations in the window (increase of _count)."),
    ]


DERIVED_SERIES: tuple[DerivedSeries, ...] = (
    *_latency("ttft", "Time to first token"),
    *_latency("tpot", "Time per output token, one value per request"),
    *_latency("itl", "Inter-token latency, one value per engine iteration"),
    *_latency("e2el", "End-to-end request latency"),
    DerivedSeries("prompt_tokens_per_second", "Prompt (prefill) tokens per second."),
    DerivedSeries("prompt_tokens_per_second_per_gpu", "Prompt tokens per second per GPU."),
    DerivedSeries("generation_tokens_per_second", "Generated tokens per second."),
    DerivedSeries("generation_tokens_per_second_per_gpu", "Generated tokens per second per GPU."),
    DerivedSeries("requests_per_second", "Finished requests per second (all finished reasons)."),
    DerivedSeries("requests_per_second_per_gpu", "Finished requests per second per GPU."),
    DerivedSeries("finished_requests_per_second", "Finished requests per second by finished reason.",
                  ("finished_reason",)),
    DerivedSeries("kv_cache_usage_max_ratio", "Highest KV-cache usage (0-1) seen in the window."),
    DerivedSeries("kv_cache_usage_mean_ratio", "KV-cache usage (0-1), mean over the window and instances."),
    DerivedSeries("requests_running", "Requests running, mean over the window, summed over instances."),
    DerivedSeries("requests_waiting", "Requests waiting, mean over the window, summed over instances."),
    DerivedSeries("preemptions_per_second", "Preemptions per second."),
    DerivedSeries("preemptions_per_request", "Preemptions per finished request, mean over the window: "
                  f"increase(sum)/increase(count) of {catalog.REQUEST_NUM_PREEMPTIONS.name} (a P/D "
                  "request counts on its prefill and its decode instance)."),
    DerivedSeries(slo.FAILED_REQUESTS, "Requests the fleet should have served and did not, per "
                  "second, by reason: abort and error (finished_reason), rejected (admission).", ("reason",)),
    DerivedSeries(slo.FAILURES_COUNTED, "1 when attainment counts failed requests (the targets expose "
                  "finished_reason); 0: the histogram-only fallback of older vLLM (failures unseen)."),
    DerivedSeries(f"{slo.ATTAINMENT}_ratio", "Share of requests served within the SLO, of all requests the "
                  "fleet should have served: increase(bucket{le=threshold})/increase(count) x served/"
                  "(served + failed); interpolated where the threshold is not a bucket boundary.", ("slo",)),
    DerivedSeries("slo_threshold_seconds", "The SLO threshold from the spec.", ("slo",)),
    DerivedSeries(f"{slo.ATTAINMENT}_exact", "1 when the threshold is a bucket boundary (the histogram share "
                  "is exact), 0 when it is interpolated.", ("slo",)),
    DerivedSeries(f"{slo.ATTAINMENT}_lower_ratio", "Lower bound on the share of requests served meeting "
                  "every per-request SLO (ttft, tpot, e2el): max(0, sum(a_i) - (n-1))."),
    DerivedSeries(f"{slo.ATTAINMENT}_upper_ratio", "Upper bound on the share of requests served meeting "
                  "every per-request SLO: min(a_i)."),
    DerivedSeries(f"{slo.GOODPUT_REQUESTS}_lower", "Good requests per second, lower bound: all requests "
                  "the fleet should have served per second x the joint lower bound."),
    DerivedSeries(f"{slo.GOODPUT_REQUESTS}_upper", "Good requests per second, upper bound."),
    DerivedSeries(f"{slo.GOODPUT_TOKENS}_lower", "Generated tokens/s x the joint lower bound."),
    DerivedSeries(f"{slo.GOODPUT_TOKENS}_upper", "Generated tokens/s x the joint upper bound."),
    DerivedSeries("goodput_tokens_per_second_per_gpu_lower", "Goodput tokens/s per GPU, lower bound."),
    DerivedSeries("goodput_tokens_per_second_per_gpu_upper", "Goodput tokens/s per GPU, upper bound."),
    *_latency("kv_transfer", "KV-transfer time (P/D; NIXL or Mooncake)"),
    DerivedSeries("kv_transfers_per_second", "KV transfers per second (NIXL or Mooncake)."),
    DerivedSeries("kv_transfer_bytes_per_second", "KV bytes transferred per second (NIXL or Mooncake)."),
    DerivedSeries("kv_transfer_bandwidth_bytes_per_second", "Bytes moved per second of transfer time "
                  "(per-transfer bandwidth): increase(bytes sum)/increase(time sum)."),
    DerivedSeries("kv_transfer_failures_per_second", "Failed KV transfers per second (NIXL or Mooncake)."),
    DerivedSeries("window_targets", "Targets with at least two scrapes in the window (0: nothing derived)."),
    DerivedSeries("gpus", "GPUs of the group (topology: sum of its instances' tensor-parallel sizes)."),
)


# The topology series a split (spec: entrypoint.split_by) is also exposed for, with the split label
# added: the request figures, which come from the entrypoint's series alone. Token rates, GPUs and
# KV figures come from the engines, which know no router label: never split.
SPLIT_SUFFIXES: frozenset[str] = frozenset({
    *(s.suffix for short in slo.SLO_KINDS for s in _latency(short, "")),
    "requests_per_second", "finished_requests_per_second", slo.FAILED_REQUESTS, slo.FAILURES_COUNTED,
    f"{slo.ATTAINMENT}_ratio", "slo_threshold_seconds", f"{slo.ATTAINMENT}_exact",
    f"{slo.ATTAINMENT}_lower_ratio", f"{slo.ATTAINMENT}_upper_ratio",
    f"{slo.GOODPUT_REQUESTS}_lower", f"{slo.GOODPUT_REQUESTS}_upper",
})


# 1 for the source of a topology's request figures (crossover.spec.REQUEST_SOURCES).
REQUESTS_SOURCE = f"{PREFIX}_topology_requests_source"


def derived_name(level: str, suffix: str) -> str:
    return f"{PREFIX}_{level}_{suffix}"


TARGET_METRICS: tuple[ExportedMetric, ...] = (
    ExportedMetric(f"{PREFIX}_target_up", "gauge", "1 when the last scrape of the target succeeded.",
                   TARGET_LABELS),
    ExportedMetric(f"{PREFIX}_scrape_duration_seconds", "gauge",
                   "Duration of the last scrape of the target, success or failure.", TARGET_LABELS),
    ExportedMetric(f"{PREFIX}_scrape_errors_total", "counter",
                   "Failed scrapes of the target by reason (timeout, connection, http_status, too_large, "
                   "read, parse, too_many_series, router_series).", (*TARGET_LABELS, "reason")),
    ExportedMetric(f"{PREFIX}_scrapes_total", "counter", "Scrapes of the target, success or failure.",
                   TARGET_LABELS),
    ExportedMetric(f"{PREFIX}_scrape_body_bytes", "gauge",
                   "Size of the last successful payload (decompressed).", TARGET_LABELS),
)

EXPORTER_METRICS: tuple[ExportedMetric, ...] = (
    ExportedMetric(f"{PREFIX}_exporter_cycle_seconds", "gauge", "Wall time of the last scrape cycle.", ()),
    ExportedMetric(f"{PREFIX}_exporter_spec_reloads_total", "counter",
                   "Spec reloads (SIGHUP) by result (ok, error).", ("result",)),
    ExportedMetric(f"{PREFIX}_exporter_targets", "gauge", "Targets scraped each cycle.", ()),
)

TOPOLOGY_METRICS: tuple[ExportedMetric, ...] = (
    ExportedMetric(REQUESTS_SOURCE, "gauge",
                   "1 for where the topology's request figures come from: entrypoint (each request once, "
                   "as its user waited for it), decode (no entrypoint metrics: decode-side, TTFT excludes "
                   "the prefill) or instances (colocated).", ("topology", "window", "source")),
)

EXPORTED_METRICS: tuple[ExportedMetric, ...] = (
    *TARGET_METRICS,
    *EXPORTER_METRICS,
    *TOPOLOGY_METRICS,
    *(ExportedMetric(derived_name(level, series.suffix), "gauge", series.help,
                     (*LEVEL_LABELS[level], "window", *series.extra_labels))
      for level in LEVELS for series in DERIVED_SERIES),
)

EXPORTED_NAMES: frozenset[str] = frozenset(m.name for m in EXPORTED_METRICS)
