"""An instance's vLLM metrics: cheap accumulators on the token path, prometheus_client exposition.

Names, types, labels and buckets all come from crossover.catalog. Counting happens in plain Python
lists (one bisect per observation, no locks: everything runs on the instance's event loop), and a
custom collector turns them into prometheus_client families at scrape time, so the payload is
prometheus_client's text format exactly as a real vLLM server writes it (`_total`, `_created`,
sorted labels, `+Inf`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric as PromFamily

from crossover import catalog, slo
from crossover.exposition import Hist, family, http_key

LABEL_NAMES = catalog.ENGINE_LABELS


@dataclass(frozen=True)
class QueueState:
    """The engine gauges, read at scrape time."""

    running: int
    waiting_capacity: int
    waiting_deferred: int
    kv_usage: float
    preemptions: int


def _major_minor(vllm_version: str) -> tuple[int, int]:
    parts = vllm_version.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(f"not a vLLM version: {vllm_version!r} (want e.g. 0.32.0)") from None


def legacy_mode(vllm_version: str) -> tuple[bool, bool]:
    """(emit current names, emit legacy names) for a vLLM version: 0.10 only the old names of renamed
    families, 0.11 both (old ones deprecated), 0.12 and later only the current ones."""
    major, minor = _major_minor(vllm_version)
    if (major, minor) < (0, 11):
        return False, True
    if (major, minor) == (0, 11):
        return True, True
    return True, False


def version_at_least(vllm_version: str, since: str) -> bool:
    """Whether a simulated vLLM version serves a family first checked in `since` (major.minor)."""
    return _major_minor(vllm_version) >= _major_minor(since)


class InstanceMetrics:
    """Counters and histograms of one simulated vLLM engine (engine="0")."""

    def __init__(self, model_name: str, max_model_len: int, queue_state: Callable[[], QueueState],
                 kv_connector: catalog.KvConnector | None = None, request_preemptions: bool = True) -> None:
        self.labels = {"model_name": model_name, "engine": "0"}
        # catalog.REQUEST_NUM_PREEMPTIONS, served by the versions it was checked in (catalog)
        self.request_preemptions = request_preemptions
        self.max_model_len = max_model_len
        self.queue_state = queue_state
        self.kv_connector = kv_connector
        self.reset()

    def reset(self) -> None:
        """A process restart: every counter and histogram starts again from zero."""
        now = time.time()
        self.created = now
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_by_source = dict.fromkeys(catalog.PROMPT_SOURCES, 0)
        self.success = dict.fromkeys(catalog.FINISHED_REASONS, 0)
        self.rejections = dict.fromkeys(catalog.ADMISSION_REJECTION_REASONS, 0)
        self.http: dict[tuple[str, str, str], int] = {}  # (handler, method, status class) -> requests
        token_buckets = catalog.token_count_buckets(self.max_model_len)
        self.ttft = Hist(catalog.TTFT.buckets, now)
        self.itl = Hist(catalog.ITL.buckets, now)
        self.tpot = Hist(catalog.TPOT.buckets, now)
        self.e2e = Hist(catalog.E2E_LATENCY.buckets, now)
        self.queue = Hist(catalog.QUEUE_TIME.buckets, now)
        self.prefill = Hist(catalog.PREFILL_TIME.buckets, now)
        self.decode = Hist(catalog.DECODE_TIME.buckets, now)
        self.inference = Hist(catalog.INFERENCE_TIME.buckets, now)
        self.request_prompt = Hist(token_buckets, now)
        self.request_generation = Hist(token_buckets, now)
        self.request_num_preemptions = Hist(catalog.REQUEST_NUM_PREEMPTIONS.buckets, now)
        connector = self.kv_connector or catalog.NIXL
        self.kv_xfer = Hist(connector.xfer_time.buckets, now)
        self.kv_post = Hist(connector.post_time.buckets if connector.post_time else (), now)
        self.kv_bytes = Hist(connector.bytes.buckets, now)
        self.kv_descriptors = Hist(connector.descriptors.buckets, now)
        self.kv_failed_transfers = 0

    # --- events --------------------------------------------------------------------------------
    def on_prompt(self, prompt_tokens: int, cached_tokens: int, remote_tokens: int) -> None:
        """A request's prefill is done: vLLM counts every prompt token, then where each came from."""
        self.prompt_tokens += prompt_tokens
        self.prefix_queries += prompt_tokens
        self.prefix_hits += cached_tokens
        self.prompt_by_source["local_cache_hit"] += cached_tokens
        self.prompt_by_source["external_kv_transfer"] += remote_tokens
        self.prompt_by_source["local_compute"] += prompt_tokens - cached_tokens - remote_tokens

    def on_finished(self, *, reason: str, arrival: float, scheduled: float, first_token: float,
                    last_token: float, prompt_tokens: int, generated: int, preemptions: int = 0) -> None:
        self.success[reason] += 1
        self.request_num_preemptions.observe(preemptions)
        self.e2e.observe(last_token - arrival)
        self.queue.observe(scheduled - arrival)
        self.prefill.observe(first_token - scheduled)
        decode = last_token - first_token
        self.decode.observe(decode)
        self.inference.observe(last_token - scheduled)
        self.tpot.observe(slo.tpot(decode, generated))
        self.request_prompt.observe(prompt_tokens)
        self.request_generation.observe(generated)

    def on_engine_error(self, *, arrival: float, now: float, prompt_tokens: int) -> None:
        """A request the engine failed before its first token: vLLM counts it by finished_reason
        "error" and observes it in the per-finished-request histograms like any other."""
        self.on_finished(reason="error", arrival=arrival, scheduled=arrival, first_token=now, last_token=now,
                         prompt_tokens=prompt_tokens, generated=0)

    def on_http(self, handler: str, method: str, status: int) -> None:
        """One answered API request, as prometheus-fastapi-instrumentator counts it (status class)."""
        key = http_key(handler, method, status)
        self.http[key] = self.http.get(key, 0) + 1

    def on_kv_transfer(self, seconds: float, nbytes: float, descriptors: int) -> None:
        self.kv_xfer.observe(seconds)
        self.kv_post.observe(min(seconds, 0.0005))
        self.kv_bytes.observe(nbytes)
        self.kv_descriptors.observe(descriptors)

    # --- exposition ----------------------------------------------------------------------------
    def families(self, *, current: bool = True, legacy: bool = False) -> Iterator[PromFamily]:
        state = self.queue_state()
        values: list[tuple[catalog.Metric, object]] = [
            (catalog.NUM_REQUESTS_RUNNING, float(state.running)),
            (catalog.NUM_REQUESTS_WAITING, float(state.waiting_capacity + state.waiting_deferred)),
            (catalog.NUM_REQUESTS_WAITING_BY_REASON,
             dict(zip(catalog.WAITING_REASONS, (float(state.waiting_capacity), float(state.waiting_deferred)),
                      strict=True))),
            (catalog.KV_CACHE_USAGE, state.kv_usage),
            (catalog.PREFIX_CACHE_QUERIES, float(self.prefix_queries)),
            (catalog.PREFIX_CACHE_HITS, float(self.prefix_hits)),
            (catalog.NUM_PREEMPTIONS, float(state.preemptions)),
            (catalog.PROMPT_TOKENS, float(self.prompt_tokens)),
            (catalog.PROMPT_TOKENS_BY_SOURCE, {k: float(v) for k, v in self.prompt_by_source.items()}),
            (catalog.PROMPT_TOKENS_CACHED,
             float(self.prefix_hits + self.prompt_by_source["external_kv_transfer"])),
            (catalog.GENERATION_TOKENS, float(self.generation_tokens)),
            (catalog.REQUEST_SUCCESS, {k: float(v) for k, v in self.success.items()}),
            (catalog.ADMISSION_REJECTIONS, {k: float(v) for k, v in self.rejections.items()}),
            (catalog.HTTP_REQUESTS, {k: float(v) for k, v in self.http.items()}),
            (catalog.REQUEST_PROMPT_TOKENS, self.request_prompt),
            (catalog.REQUEST_GENERATION_TOKENS, self.request_generation),
            *([(catalog.REQUEST_NUM_PREEMPTIONS, self.request_num_preemptions)]
              if self.request_preemptions else []),
            (catalog.TTFT, self.ttft),
            (catalog.ITL, self.itl),
            (catalog.TPOT, self.tpot),
            (catalog.E2E_LATENCY, self.e2e),
            (catalog.QUEUE_TIME, self.queue),
            (catalog.INFERENCE_TIME, self.inference),
            (catalog.PREFILL_TIME, self.prefill),
            (catalog.DECODE_TIME, self.decode),
        ]
        connector = self.kv_connector
        if connector is not None:
            values += [
                (connector.xfer_time, self.kv_xfer),
                *([(connector.post_time, self.kv_post)] if connector.post_time else []),
                (connector.bytes, self.kv_bytes),
                (connector.descriptors, self.kv_descriptors),
                (connector.failed_transfers, float(self.kv_failed_transfers)),
                *((counter, 0.0) for counter in connector.other_counters),
            ]
        for metric, value in values:
            names = []
            if current or not metric.aliases:
                names.append(metric.name)
            if legacy and metric.aliases:
                names.append(metric.aliases[0])
            for name in names:
                yield self._family(metric, name, value)

    def _family(self, metric: catalog.Metric, name: str, value: object) -> PromFamily:
        return family(metric, name, self.labels, self.created, value)


class _View:
    """A collector over one instance's metrics in one naming mode (prometheus_client asks collect())."""

    def __init__(self, metrics: InstanceMetrics, current: bool, legacy: bool) -> None:
        self.metrics, self.current, self.legacy = metrics, current, legacy

    def collect(self) -> Iterator[PromFamily]:
        return self.metrics.families(current=self.current, legacy=self.legacy)


def render(metrics: InstanceMetrics, *, current: bool = True, legacy: bool = False) -> bytes:
    """The /metrics payload in prometheus_client's text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_View(metrics, current, legacy))
    return generate_latest(registry)


def malformed(payload: bytes) -> bytes:
    """A payload a Prometheus parser rejects: a sample line with a broken label set half-way down."""
    lines = payload.split(b"\n")
    middle = len(lines) // 2
    lines.insert(middle, b'vllm_simulator_fault{engine="0",model_name= 1.0 garbage')
    return b"\n".join(lines)
