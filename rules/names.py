"""Every name the rules give a series, and where each alert's runbook is: the recording-rule names
the dashboards, the app and the tests query (imported, never spelled there), the levels they start
with, and the runbook link of an alert. The rules' counterpart of exporter/names.py, which names the
exporter's own series (`crossover_*`); no vLLM metric name is spelled here: they come from the catalog.

Naming follows Prometheus practice `level:metric:operations`:
  topology:vllm_generation_tokens:rate1m               sum by topology of a counter's rate
  topology:vllm_time_to_first_token_seconds:p99_1m     quantile of the topology-summed buckets
  topology:vllm_attainment_tpot:ratio_rate5m           share of requests within the TPOT SLO
  slo:sli_error:ratio_rate1h{slo="tpot"}               Sloth-style SLI error, for burn-rate alerts
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol

from crossover import catalog, slo
from crossover.catalog import Metric

# ---- levels: the first part of a name, and the labels its series keep ---------------------------
# Every aggregated series keeps the topology the scrape config attached, and the model.
TOPOLOGY_BY = ("topology", "model_name")
ROLE_BY = ("topology", "role", "model_name")
# The level of the per-role figures: its names start with it (topology_role:...).
ROLE_LEVEL = "topology_role"
# Per replica (the scrape config's and PodMonitor's `replica` label): the request outcome families,
# read raw once; the per-role outcome figures are sums of these.
REPLICA_BY = ("topology", "role", "replica", "model_name")
REPLICA_LEVEL = "topology_replica"


# ---- what a name is built from ---------------------------------------------------------------

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
        RawSeries.raw: None for the counters' PromQL names)."""
        return "|".join(re.escape(m.promql_name if suffix is None else m.name + suffix) for m in self.metrics)


KV_TIME = KvFamily("vllm_kv_transfer_time_seconds",
                   tuple(c.xfer_time for c in catalog.KV_CONNECTORS.values()))
KV_BYTES = KvFamily("vllm_kv_transfer_bytes", tuple(c.bytes for c in catalog.KV_CONNECTORS.values()))
KV_FAILURES = KvFamily("vllm_kv_transfer_failures",
                       tuple(c.failed_transfers for c in catalog.KV_CONNECTORS.values()))
KV_HISTOGRAMS: tuple[KvFamily, ...] = (KV_TIME, KV_BYTES)


# ---- recording-rule names --------------------------------------------------------------------

def rate_name(metric: Stemmed, window: str, level: str = "topology") -> str:
    return f"{level}:{metric.rule_stem}:rate{window}"


def histogram_rate_name(metric: Stemmed, part: str, window: str, level: str = "topology") -> str:
    """part is bucket, count or sum."""
    return f"{level}:{metric.rule_stem}_{part}:rate{window}"


def quantile_name(metric: Stemmed, quantile: float, window: str, level: str = "topology") -> str:
    return f"{level}:{metric.rule_stem}:{slo.percentile_label(quantile)}_{window}"


def interactivity_name(window: str) -> str:
    """One user's decode rate, output tokens/s per user: slo.interactivity of the topology's TPOT
    at slo.INTERACTIVITY_QUANTILE (the Pareto view's x axis; its y is per_gpu_name of the
    generation tokens)."""
    return f"topology:vllm_{slo.INTERACTIVITY}:{slo.percentile_label(slo.INTERACTIVITY_QUANTILE)}_{window}"


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


# ---- alerts ----------------------------------------------------------------------------------

BURN_ALERT = "VllmGoodputBudgetBurn"  # the multi-window burn-rate alert on the goodput SLO


def runbook_url(base: str, alert: str) -> str:
    """Where an alert's runbook is: its section of docs/runbooks.md (or the --runbook-base page),
    anchored by the alert's name in lower case."""
    return f"{base}#{alert.lower()}"
