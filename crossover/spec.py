"""The fleet spec: one YAML file describing the model, hardware, topologies, SLOs and scraping.

Every part of the project reads the spec through `load_spec`, which returns frozen, typed objects
or raises `SpecError` with a one-line message naming the file, the field and the problem.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import typing
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from crossover.catalog import DIALECTS, KV_CONNECTORS, split_labels
from crossover.errors import UserError
from crossover.netutil import check_http_url
from crossover.slo import SLO_HISTOGRAMS, boundary_index, not_a_boundary

_DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_NAME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9_.-]*$")
# The container port name of llm-d's endpoint picker's /metrics (9090): llm-d/llm-d-router
# config/charts/routerlib/templates/_deployment.yaml at 2200bfc (its Service names it http-metrics).
ROUTER_METRICS_PORT = "metrics"


class SpecError(UserError):
    """A spec that cannot be used; the message is one line meant for the user."""


def parse_duration(text: str | float | int) -> float:
    """Prometheus-style duration ("500ms", "5s", "1m", "30d") to seconds."""
    if isinstance(text, bool):
        raise ValueError(f"not a duration: {text!r}")
    if isinstance(text, int | float):
        if text <= 0 or not math.isfinite(text):
            raise ValueError(f"duration must be positive, got {text!r}")
        return float(text)
    match = _DURATION_RE.match(str(text).strip())
    if not match:
        raise ValueError(f"not a duration: {text!r} (use e.g. 500ms, 5s, 1m, 6h, 30d)")
    seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {text!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds to the shortest exact Prometheus duration ("300" -> "5m")."""
    for unit in ("w", "d", "h", "m", "s"):
        size = _DURATION_UNITS[unit]
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds / size)}{unit}"
    return f"{round(seconds * 1000)}ms"


PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]


def _check_name(value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"bad name {value!r} (letters, digits, _ . -; starts with a letter)")
    return value


# Names become Prometheus label values and file names: keep them plain.
Name = Annotated[str, AfterValidator(_check_name)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


class Role(StrEnum):
    COLOCATED = "colocated"
    PREFILL = "prefill"
    DECODE = "decode"


# The role label of a topology's entrypoint target (its router's metrics): not an instance role,
# since the router serves no model; the exporter and the rules read user-facing figures from it.
ENTRYPOINT_ROLE = "entrypoint"


# Where a topology's request figures (latencies, requests, goodput) come from, most faithful first,
# and how a dashboard or page says so (docs/routers.md): its entrypoint (what users waited for), its
# decode role (a P/D topology without entrypoint metrics), or its instances (colocated).
REQUEST_SOURCES: dict[str, str] = {
    "entrypoint": "entrypoint",
    "decode": "decode-side: excludes the prefill",
    "instances": "instances",
}


def requests_source(*, entrypoint_counts: bool, has_decode: bool) -> str:
    """Which of REQUEST_SOURCES stands for a topology's requests, so that each is counted once: its
    entrypoint when that counts requests, else its decode role (never both P/D roles), else its
    instances."""
    if entrypoint_counts:
        return "entrypoint"
    return "decode" if has_decode else "instances"


def entrypoint_replica(topology: str) -> str:
    """The instance (exporter) and replica (Prometheus) label of a topology's entrypoint target."""
    return f"{topology}-entrypoint"


class Interconnect(StrEnum):
    NVLINK = "nvlink"
    PCIE = "pcie"


class Balance(StrEnum):
    ROUND_ROBIN = "round_robin"
    LEAST_OUTSTANDING = "least_outstanding"


class Model(_Strict):
    """The served model; the shape fields drive the simulator's roofline."""

    name: str = Field(min_length=1, description="served model name (model_name label)")
    params_b: PositiveFloat = Field(description="parameters, in billions")
    layers: PositiveInt
    hidden_size: PositiveInt
    heads: PositiveInt
    kv_heads: PositiveInt
    dtype_bytes: PositiveFloat = 2.0
    max_model_len: PositiveInt = 131072
    intermediate_size: PositiveInt | None = Field(
        default=None, description="MLP width (Llama-3.1-70B: 28672); needed by the per-kernel model")
    vocab_size: PositiveInt = Field(default=128256, description="LM-head rows (the per-kernel model)")

    @model_validator(mode="after")
    def _heads_divide(self) -> Model:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        return self

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V for every layer: 2 x layers x kv_heads x head_dim x dtype (70B BF16: 320 KiB)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


class Hardware(_Strict):
    """One GPU of the fleet and how GPUs and instances are linked."""

    gpu: str = "GPU"
    memory_gib: PositiveFloat
    hbm_bandwidth_gbps: PositiveFloat = Field(description="HBM bandwidth, GB/s")
    bf16_tflops: PositiveFloat
    interconnect: Interconnect = Interconnect.NVLINK
    allreduce_latency_us: PositiveFloat | None = Field(
        default=None, description="per all-reduce; default from the interconnect and TP size")
    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.9
    allreduce_gbps: PositiveFloat | None = Field(
        default=None, description="all-reduce bus bandwidth, GB/s; adds a size term to each all-reduce")
    # The per-kernel step model (sim/model.py, docs/simulator.md) is used when kernel_us is set; the
    # figures come from benchmarks/gpu_profile.py on the GPU (the `copy`, `gemm` and step rows).
    kernel_us: PositiveFloat | None = Field(
        default=None, description="fixed GPU time of one matrix or attention kernel inside a CUDA graph")
    small_kernel_us: PositiveFloat | None = Field(
        default=None, description="GPU time of one short elementwise kernel (norm, rotary, cache write)")
    attention_mfu: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.7, description="share of bf16_tflops a prefill attention kernel achieves")
    attention_mfu_after_context: Annotated[float, Field(gt=0, le=1)] | None = Field(
        default=None, description="share of bf16_tflops a prefill chunk's attention over its earlier context "
                                  "achieves; default attention_mfu")
    decode_attention_ns_per_token: PositiveFloat | None = Field(
        default=None, description="decode attention's time per context token of one sequence when the batch "
                                  "is too small to fill the GPU (split-KV's serial walk)")
    kv_link_gbps: PositiveFloat = Field(default=25.0, description="P/D KV-transfer link, GB/s")
    kv_link_latency_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0


class Instance(_Strict):
    name: Name
    url: str
    role: Role = Role.COLOCATED
    # A P/D topology's prefill and decode roles may shard the model differently (DistServe's point):
    # None takes the topology's tensor_parallel_size.
    tensor_parallel_size: PositiveInt | None = None

    _url = field_validator("url")(check_http_url)


class Entrypoint(_Strict):
    """Where traffic for a topology goes: one URL (load balancer, P/D proxy) or client-side balancing."""

    url: str | None = None
    balance: Balance | None = None
    metrics_url: str | None = Field(default=None, description="the router's /metrics "
                                    "(crossover's own proxy: <url>/metrics), scraped as role entrypoint")
    dialect: str | None = Field(default=None, description="the metric families the router serves: one of "
                                "catalog.DIALECTS (vllm, llm-d, llm-d-legacy, production-stack); "
                                "detected from what it serves when left out")
    selector: dict[str, str] | None = Field(
        default=None, description="on Kubernetes, instead of metrics_url: the router's pod labels (a "
        "matchLabels); its pods are the topology's entrypoint targets (docs/kubernetes.md)")
    port: str = Field(default=ROUTER_METRICS_PORT, description="with selector: the container port name "
                      "serving the router's /metrics (llm-d's endpoint picker: metrics)")
    split_by: list[str] = Field(
        default_factory=list, description="extra labels of the router's request series (its dialect's "
        "split_labels, e.g. llm-d's priority) whose values also split the topology's request figures; "
        "summed away when left out (docs/routers.md)")

    @field_validator("dialect")
    @classmethod
    def _dialect(cls, value: str | None) -> str | None:
        if value is not None and value not in DIALECTS:
            raise ValueError(f"unknown dialect {value!r} (known: {', '.join(DIALECTS)})")
        return value

    @field_validator("url", "metrics_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        return None if value is None else check_http_url(value)

    @model_validator(mode="after")
    def _one_of(self) -> Entrypoint:
        if (self.url is None) == (self.balance is None):
            raise ValueError("give exactly one of url (a load balancer or P/D proxy) or balance "
                             "(round_robin or least_outstanding over the instances)")
        if self.metrics_url is not None and self.url is None:
            raise ValueError("metrics_url needs url: client-side balancing has no router to scrape")
        if self.selector is not None and self.url is None:
            raise ValueError("selector needs url: client-side balancing has no router to scrape")
        if self.selector is not None and self.metrics_url is not None:
            raise ValueError("give metrics_url (a fixed address) or selector (the router's pods on "
                             "Kubernetes), not both: the router would be scraped twice")
        if self.selector == {}:
            raise ValueError("selector: give at least one pod label of the router's pods")
        if self.dialect is not None and not self.scraped:
            raise ValueError("dialect needs metrics_url or selector: it names what the router's "
                             "/metrics serves")
        if self.split_by:
            allowed = split_labels(self.dialect)
            unknown = [label for label in self.split_by if label not in allowed]
            where = f"dialect {self.dialect}" if self.dialect is not None else "any known dialect"
            if unknown:
                raise ValueError(f"split_by: {', '.join(map(repr, unknown))} is no extra label of {where} "
                                 f"(allowed: {', '.join(allowed)})")
            if len(set(self.split_by)) != len(self.split_by):
                raise ValueError("split_by: a label is listed twice")
            if not self.scraped:
                raise ValueError("split_by needs metrics_url or selector: the split figures come from "
                                 "the router's own series")
        return self

    @property
    def scraped(self) -> bool:
        """Whether the router's own metrics are scraped (at a fixed address or as discovered pods)."""
        return self.metrics_url is not None or self.selector is not None


class Topology(_Strict):
    """A way of serving the model. It lists its instances, or (on Kubernetes) gives a pod label
    `selector` whose discovered pods become its instances; its GPUs are then pods x TP and follow
    the pods (`gpus` is left out, read as 0)."""

    name: Name
    gpus: Annotated[int, Field(ge=0)] = 0
    tensor_parallel_size: PositiveInt
    instances: list[Instance] = Field(default_factory=list)
    selector: dict[str, str] = Field(default_factory=dict, description="Kubernetes pod labels (matchLabels) "
                                     "whose pods are this topology's instances, instead of listing them")
    pd: bool = Field(default=False, description="a selector topology whose pods are prefill and decode "
                     "(their role from kubernetes.role_label)")
    entrypoint: Entrypoint = Entrypoint(balance=Balance.ROUND_ROBIN)

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            check_k8s_label(key, label_value)
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Topology:
        if bool(self.instances) == bool(self.selector):
            raise ValueError("give exactly one of instances (listed) or selector (Kubernetes pod labels "
                             "whose pods are the instances)")
        if self.selector:
            if self.gpus:
                raise ValueError("gpus: leave it out for a selector topology (its GPUs are its discovered "
                                 "pods x tensor_parallel_size)")
            if self.pd and self.entrypoint.url is None:
                raise ValueError("a P/D topology needs entrypoint.url (the P/D proxy)")
            return self
        if self.pd:
            raise ValueError("pd: only for a selector topology (a listed one says its instances' roles)")
        if not self.gpus:
            raise ValueError("gpus: required for a topology that lists its instances")
        roles = {i.role for i in self.instances}
        disaggregated = roles & {Role.PREFILL, Role.DECODE}
        if disaggregated and roles != {Role.PREFILL, Role.DECODE}:
            raise ValueError("a P/D topology needs at least one prefill and one decode instance "
                             f"and no colocated ones (has {sorted(r.value for r in roles)})")
        if disaggregated and self.entrypoint.url is None:
            raise ValueError("a P/D topology needs entrypoint.url (the P/D proxy)")
        used = sum(self.tp_of(i) for i in self.instances)
        if used != self.gpus:
            sizes = sorted({self.tp_of(i) for i in self.instances})
            if len(sizes) == 1:
                raise ValueError(f"gpus is {self.gpus} but {len(self.instances)} instance(s) x "
                                 f"tensor_parallel_size {sizes[0]} use {used}")
            raise ValueError(f"gpus is {self.gpus} but the instances' tensor_parallel_size "
                             f"({' + '.join(str(self.tp_of(i)) for i in self.instances)}) use {used}")
        names = [i.name for i in self.instances]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate instance names in {names}")
        return self

    @property
    def disaggregated(self) -> bool:
        return self.pd or any(i.role is not Role.COLOCATED for i in self.instances)

    @property
    def discovered(self) -> bool:
        """Its instances are the pods its selector finds, not a list in the spec."""
        return bool(self.selector)

    def nominal_instances(self) -> list[Instance]:
        """The listed instances, or for a selector topology one stand-in pod per role (what the
        generated promtool tests feed the rules; never scraped)."""
        if self.instances:
            return self.instances
        roles = [Role.PREFILL, Role.DECODE] if self.pd else [Role.COLOCATED]
        return [Instance(name=f"{self.name}-{role.value}-pod", url=f"http://{self.name}-{role.value}-pod:8000",
                         role=role) for role in roles]

    @property
    def configured_requests_source(self) -> str:
        """requests_source as the spec sets it up (the exporter falls back to the decode role when
        the entrypoint's metrics turn out to count no requests)."""
        return requests_source(entrypoint_counts=self.entrypoint.scraped,
                               has_decode=self.disaggregated)

    def tp_of(self, instance: Instance) -> int:
        """An instance's tensor-parallel size: its own, else the topology's."""
        return instance.tensor_parallel_size or self.tensor_parallel_size

    def tp_for(self, instance_name: str, role: str) -> int:
        """The TP size of a target found outside the spec (file service discovery): the spec
        instance of that name's, else the one its role's instances share, else the topology's."""
        for instance in self.instances:
            if instance.name == instance_name:
                return self.tp_of(instance)
        sizes = {self.tp_of(i) for i in self.instances if i.role.value == role}
        return sizes.pop() if len(sizes) == 1 else self.tensor_parallel_size

    @property
    def tp_sizes(self) -> list[int]:
        """The distinct tensor-parallel sizes of the instances, smallest first (a selector
        topology's pods, not listed, all take the topology's)."""
        return sorted({self.tp_of(i) for i in self.instances}) or [self.tensor_parallel_size]


class Slos(_Strict):
    """Latency SLOs in milliseconds (any subset) and the objective over the period."""

    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = None
    itl_ms: PositiveFloat | None = None
    e2el_ms: PositiveFloat | None = None
    objective: Annotated[float, Field(gt=0, lt=1)] = 0.99
    period: str = "30d"

    @field_validator("period")
    @classmethod
    def _period(cls, value: str) -> str:
        parse_duration(value)
        return value

    @model_validator(mode="after")
    def _at_least_one(self) -> Slos:
        if not self.thresholds_ms:
            raise ValueError("give at least one of ttft_ms, tpot_ms, itl_ms, e2el_ms")
        return self

    @property
    def thresholds_ms(self) -> dict[str, float]:
        """SLO name ("ttft", "tpot", "itl", "e2el") -> threshold in ms, only those given."""
        values = {"ttft": self.ttft_ms, "tpot": self.tpot_ms, "itl": self.itl_ms, "e2el": self.e2el_ms}
        return {k: v for k, v in values.items() if v is not None}

    @property
    def period_seconds(self) -> float:
        return parse_duration(self.period)


class ScrapeConfig(_Strict):
    interval: str = "5s"
    timeout: str = "2s"
    bearer_token_env: str | None = None
    bearer_token_file: str | None = None
    max_body_bytes: PositiveInt = 16 * 1024 * 1024
    # Like Prometheus's sample_limit: one vLLM engine exposes about 100 series of the families the
    # exporter reads, so 2000 leaves room for 16 data-parallel engines and refuses a cardinality burst.
    max_series: PositiveInt = 2000
    windows: list[str] = Field(default_factory=lambda: ["1m"], min_length=1)

    @field_validator("interval", "timeout")
    @classmethod
    def _duration(cls, value: str) -> str:
        parse_duration(value)
        return value

    @field_validator("windows")
    @classmethod
    def _windows(cls, value: list[str]) -> list[str]:
        for window in value:
            parse_duration(window)
        if len(set(value)) != len(value):
            raise ValueError(f"duplicate windows in {value}")
        return value

    @model_validator(mode="after")
    def _token_source(self) -> ScrapeConfig:
        if self.bearer_token_env and self.bearer_token_file:
            raise ValueError("give bearer_token_env or bearer_token_file, not both")
        if parse_duration(self.timeout) > parse_duration(self.interval):
            raise ValueError(f"timeout {self.timeout} is longer than interval {self.interval}")
        return self

    @property
    def interval_seconds(self) -> float:
        return parse_duration(self.interval)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.timeout)

    @property
    def window_seconds(self) -> list[float]:
        return [parse_duration(w) for w in self.windows]

    def bearer_token(self) -> str | None:
        """Read the token at use time so it never sits in the spec object or its repr."""
        if self.bearer_token_env:
            token = os.environ.get(self.bearer_token_env)
            if not token:
                raise SpecError(f"scrape.bearer_token_env: environment variable "
                                f"{self.bearer_token_env} is not set or empty")
            return token.strip()
        if self.bearer_token_file:
            try:
                return Path(self.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise SpecError(f"scrape.bearer_token_file: cannot read {self.bearer_token_file}: "
                                f"{exc.strerror}") from None
        return None


class Fault(_Strict):
    """A simulator fault switched on at start; the admin endpoint can change it later."""

    slowdown: PositiveFloat = 1.0
    error_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    drop_rate: Annotated[float, Field(ge=0, le=1)] = 0.0
    stall_metrics: bool = False
    malformed_metrics: bool = False
    truncated_metrics: bool = False
    legacy_names: bool = False


class Simulator(_Strict):
    """Options of the embedded simulator; ignored by real fleets."""

    seed: int = 0
    vllm_version: str = "0.32.0"
    kv_connector: str = Field(default="nixl", description="KV connector of P/D instances: the families "
                              "their /metrics expose (nixl or mooncake)")
    faults: dict[str, Fault] = Field(default_factory=dict, description="instance name -> fault")
    time_scale: PositiveFloat = Field(default=1.0, description="simulated seconds per wall second")
    # Performance-model knobs (docs/simulator.md explains each and how the presets were fitted).
    hbm_efficiency: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.85, description="share of peak HBM bandwidth a decode step achieves")
    mfu: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.5, description="share of peak BF16 FLOPs a compute-bound step achieves")
    gpu_time_scale: PositiveFloat = Field(
        default=1.0, description="multiplies the roofline GPU and all-reduce time; 1 = plain physics")
    host_overhead_step_us: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        default=0.0, description="CPU time per engine step not hidden behind the GPU")
    host_overhead_per_seq_us: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        default=0.0, description="CPU time per scheduled sequence per step (scheduler, sampler, detokenizer)")
    host_overhead_per_seq_per_rank_us: Annotated[float, Field(ge=0, allow_inf_nan=False)] = Field(
        default=0.0, description="CPU time per scheduled sequence per step per TP worker (input preparation)")
    max_num_seqs: PositiveInt = Field(default=256, description="vLLM --max-num-seqs per instance")
    max_num_batched_tokens: PositiveInt = Field(
        default=2048, description="vLLM --max-num-batched-tokens: chunked-prefill token budget per step")
    block_size: PositiveInt = Field(default=16, description="KV-cache block size in tokens")
    mean_output_tokens: PositiveInt = Field(
        default=128, description="mean drawn output length for requests without ignore_eos")


    @field_validator("kv_connector")
    @classmethod
    def _connector(cls, value: str) -> str:
        if value not in KV_CONNECTORS:
            raise ValueError(f"unknown KV connector {value!r} (one of {', '.join(KV_CONNECTORS)})")
        return value


# Kubernetes label keys and values (apimachinery's validation: an optional DNS-subdomain prefix and
# "/", then a name of up to 63 characters; values up to 63 characters, possibly empty).
_K8S_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_K8S_KEY_RE = re.compile(rf"^([a-z0-9]([-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_K8S_NAME}$")
_K8S_VALUE_RE = re.compile(rf"^({_K8S_NAME})?$")


def check_k8s_label(key: str, value: str | None = None) -> None:
    if not _K8S_KEY_RE.match(key):
        raise ValueError(f"{key!r} is not a Kubernetes label key (e.g. llm-d.ai/role)")
    if value is not None and not _K8S_VALUE_RE.match(value):
        raise ValueError(f"{value!r} (label {key}) is not a Kubernetes label value")


def _label_key(value: str | None) -> str | None:
    if value is not None:
        check_k8s_label(value)
    return value


LabelKey = Annotated[str, AfterValidator(_label_key)]


class KubernetesDashboards(_Strict):
    """How the dashboards are shipped as Kubernetes objects (docs/kubernetes.md)."""

    namespace: str | None = Field(default=None, description="default: kubernetes.namespace")
    # kube-prometheus-stack's Grafana sidecar picks up ConfigMaps carrying this label (chart 88.5.3
    # values.yaml: grafana.sidecar.dashboards.label grafana_dashboard, labelValue "1"); the sidecar
    # (kiwigrid/k8s-sidecar) puts a ConfigMap's files in the sub-folder its FOLDER_ANNOTATION names,
    # by default k8s-sidecar-target-directory, which Grafana shows as a folder when the provider has
    # foldersFromFilesStructure.
    sidecar_labels: dict[str, str] = Field(default_factory=lambda: {"grafana_dashboard": "1"})
    folder_annotation: LabelKey = Field(
        default="k8s-sidecar-target-directory",
        description="the annotation the sidecar reads the folder from (its folderAnnotation)")
    folder: str = Field(default="vLLM crossover", min_length=1,
                        description="Grafana folder of the dashboards")
    instance_selector: dict[str, str] = Field(
        default_factory=lambda: {"dashboards": "grafana"},
        description="Grafana Operator: matchLabels of the Grafana instances that load the dashboards")

    @field_validator("sidecar_labels", "instance_selector")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key, label_value in value.items():
            check_k8s_label(key, label_value)
        return value


class Kubernetes(_Strict):
    """Where the fleet runs on Kubernetes and how its pods' own labels say what they are: read by
    the PodMonitor, ServiceMonitor and kubernetes_sd job (rules/), the dashboards' ConfigMaps and
    GrafanaDashboards, and the exporter's discovery through Prometheus."""

    namespace: str = Field(default="default", pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
    topology_label: LabelKey | None = Field(
        default="crossover.vllm.io/topology",
        description="pod label whose value names the topology of a listed topology's pods "
                    "(e.g. app.kubernetes.io/instance)")
    topology_values: dict[str, Name] = Field(
        default_factory=dict, description="topology_label value -> topology name, where they differ")
    role_label: LabelKey | None = Field(
        default="crossover.vllm.io/role",
        description="pod label whose value names the role (e.g. llm-d.ai/role); a pod without it is "
                    "colocated")
    role_values: dict[str, str] = Field(
        default_factory=dict, description="role_label value -> colocated, prefill, decode or entrypoint, "
        "where they differ")
    tp_label: LabelKey | None = Field(
        default=None, description="pod label with the pod's tensor-parallel size; default the topology's")
    ports: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$")]] = Field(
        default_factory=lambda: ["http"], min_length=1,
        description="container (and Service) port names serving /metrics; several where roles differ "
                    "(llm-d's dev manifests: prefill-http on prefill pods, http on decode pods)")
    path: str = Field(default="/metrics", pattern=r"^/")
    prometheus_url: str | None = Field(
        default=None, description="a Prometheus whose /api/v1/targets the exporter takes pods from")
    dashboards: KubernetesDashboards = KubernetesDashboards()

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url(cls, value: str | None) -> str | None:
        return None if value is None else check_http_url(value)

    @field_validator("topology_values")
    @classmethod
    def _topology_values(cls, value: dict[str, str]) -> dict[str, str]:
        for label_value in value:
            check_k8s_label("value", label_value)
        return value

    @field_validator("role_values")
    @classmethod
    def _role_values(cls, value: dict[str, str]) -> dict[str, str]:
        roles = [*(r.value for r in Role), ENTRYPOINT_ROLE]
        for label_value, role in value.items():
            check_k8s_label("value", label_value)
            if role not in roles:
                raise ValueError(f"{label_value}: unknown role {role!r} "
                                 f"(one of {', '.join(roles)})")
        return value

    @property
    def dashboards_namespace(self) -> str:
        return self.dashboards.namespace or self.namespace

    def role_of(self, value: str) -> str:
        """The role a role_label value stands for."""
        return self.role_values.get(value, value)


class FleetSpec(_Strict):
    model: Model
    hardware: Hardware
    topologies: list[Topology] = Field(min_length=1)
    slos: Slos
    scrape: ScrapeConfig = ScrapeConfig()
    simulator: Simulator = Simulator()
    kubernetes: Kubernetes = Kubernetes()

    @model_validator(mode="after")
    def _unique(self) -> FleetSpec:
        # Errors of the whole spec have no pydantic location; each message starts with the path of
        # the offending field instead (the loader prints it as it is, see _one_line).
        first_topology: dict[str, int] = {}
        for index, topology in enumerate(self.topologies):
            if topology.name in first_topology:
                raise ValueError(f"topologies[{index}]({topology.name}).name: duplicate topology name "
                                 f"{topology.name!r} (also topologies[{first_topology[topology.name]}])")
            first_topology[topology.name] = index
        instance_names: dict[str, str] = {}
        urls: dict[str, str] = {}
        for index, topology in enumerate(self.topologies):
            for number, instance in enumerate(topology.instances):
                path = f"topologies[{index}]({topology.name}).instances[{number}]({instance.name})"
                if instance.name in instance_names:
                    raise ValueError(f"{path}.name: instance name {instance.name!r} is used twice "
                                     f"(also in {instance_names[instance.name]})")
                instance_names[instance.name] = topology.name
                if instance.url in urls:
                    raise ValueError(f"{path}.url: instance URL {instance.url} is used twice "
                                     f"(also by {urls[instance.url]})")
                urls[instance.url] = instance.name
            metrics_url = topology.entrypoint.metrics_url
            if metrics_url is not None and metrics_url in urls:
                raise ValueError(f"topologies[{index}]({topology.name}).entrypoint.metrics_url: "
                                 f"{metrics_url} is also the URL of {urls[metrics_url]}")
        names = [t.name for t in self.topologies]
        k8s = self.kubernetes
        for index, topology in enumerate(self.topologies):
            on_kubernetes = topology.discovered or k8s.topology_label is not None
            if topology.disaggregated and on_kubernetes and k8s.role_label is None:
                raise ValueError(f"topologies[{index}]({topology.name}): a P/D topology's pods need "
                                 "kubernetes.role_label, the pod label that says prefill or decode")
        for value, name in self.kubernetes.topology_values.items():
            if name not in names:
                raise ValueError(f"kubernetes.topology_values[{value}]: {name!r} is not a topology "
                                 f"(have {names})")
        unknown = set(self.simulator.faults) - set(instance_names)
        if unknown:
            raise ValueError(f"simulator.faults: unknown instance(s) {sorted(unknown)} "
                             f"(instances are {sorted(instance_names)})")
        self._check_fits()
        return self

    def _check_fits(self) -> None:
        """Each TP shard's weights must leave room for KV blocks in the GPU memory vLLM may use."""
        usable = self.hardware.memory_gib * 1024**3 * self.hardware.gpu_memory_utilization
        for index, topology in enumerate(self.topologies):
            tp = topology.tp_sizes[0]  # the smallest shard holds the most weights
            shard = self.model.weight_bytes / tp
            if shard >= usable:
                raise ValueError(
                    f"topologies[{index}]({topology.name}).tensor_parallel_size: {self.model.name} does not "
                    f"fit at TP {tp}: {shard / 1024**3:.1f} GiB of weights per GPU, "
                    f"{usable / 1024**3:.1f} GiB usable (hardware.memory_gib x gpu_memory_utilization)")
        if self.hardware.kernel_us is not None and self.model.intermediate_size is None:
            raise ValueError("model.intermediate_size: needed by the per-kernel model "
                             "(hardware.kernel_us is set)")

    def topology(self, name: str) -> Topology:
        for topology in self.topologies:
            if topology.name == name:
                return topology
        raise SpecError(f"no topology named {name!r} (have {[t.name for t in self.topologies]})")


def _location(loc: tuple[int | str, ...], data: Any) -> str:
    """Render a pydantic error location with list items named where the YAML names them."""
    parts: list[str] = []
    node: Any = data
    for item in loc:
        if isinstance(item, int):
            name = node[item].get("name") if isinstance(node, list) and item < len(node) and isinstance(
                node[item], dict) else None
            parts[-1:] = [f"{parts[-1] if parts else ''}[{item}]" + (f"({name})" if name else "")]
            node = node[item] if isinstance(node, list) and item < len(node) else None
        else:
            parts.append(str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return ".".join(parts) or "(top level)"


def _keys_at(loc: tuple[int | str, ...]) -> list[str]:
    """The keys the spec accepts at a location (list indexes and dict keys skipped), for hints."""
    model: Any = FleetSpec
    dict_key_next = False
    for item in loc:
        if isinstance(item, int) or dict_key_next:
            dict_key_next = False
            continue
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return []
        field = model.model_fields.get(item)
        if field is None:
            return []
        model = field.annotation
        dict_key_next = typing.get_origin(model) is dict
        # list[Topology], dict[str, Fault], Topology | None: look inside for the model.
        while args := [a for a in typing.get_args(model) if a is not type(None)]:
            model = args[-1]
    return list(model.model_fields) if isinstance(model, type) and issubclass(model, BaseModel) else []


# Keys a user might reach for to put a secret in the spec itself (Prometheus spells it bearer_token).
_INLINE_SECRET_KEYS = {"bearer_token", "token", "authorization", "password", "api_key"}


def _one_line(exc: ValidationError, data: Any) -> str:
    problems = []
    for error in exc.errors():
        loc = tuple(x for x in error["loc"] if not (isinstance(x, str) and x.startswith(("function-",
                                                                                        "constrained-"))))
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = "unknown key"
            if loc[:1] == ("scrape",) and str(loc[-1]) in _INLINE_SECRET_KEYS:
                message += ("; a token is never written in the spec: give bearer_token_env (an "
                            "environment variable) or bearer_token_file")
            else:
                close = difflib.get_close_matches(str(loc[-1]), _keys_at(loc[:-1]), n=1)
                message += f" (did you mean {close[0]}?)" if close else ""
        elif error["type"] == "missing":
            message = "required field is missing"
        message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if error["type"] in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
            message += f" (got {error.get('input')!r})"
        problems.append(f"{_location(loc, data)}: {message}" if loc else message)
    text = problems[0]
    if len(problems) > 1:
        text += f" (and {len(problems) - 1} more problem{'s' if len(problems) > 2 else ''})"
    return text.replace("\n", " ")


def parse_spec(data: Any, source: str = "spec") -> FleetSpec:
    """Validate already-loaded YAML data; raise SpecError with a one-line message."""
    if not isinstance(data, dict):
        raise SpecError(f"{source}: the top level must be a mapping with model, hardware, topologies, slos")
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{source}: {_one_line(exc, data)}") from None


def load_spec(path: str | os.PathLike[str]) -> FleetSpec:
    """Read and validate a spec file; every error is one line naming the file, field and problem."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{source}: is a directory, not a spec file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{source}: cannot read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{source}: {where}{problem}") from None
    except RecursionError:
        raise SpecError(f"{source}: YAML nested too deeply") from None
    return parse_spec(data, source)


def slo_warnings(spec: FleetSpec, source: str = "spec") -> list[str]:
    """One line for each SLO threshold that is not on a bucket boundary of the histogram it is judged
    on: vLLM's defaults, and the own buckets of each router dialect an entrypoint names."""
    dialects = dict.fromkeys([DIALECTS["vllm"], *(DIALECTS[t.entrypoint.dialect] for t in spec.topologies
                                                   if t.entrypoint.dialect is not None)])
    warnings = []
    for slo, threshold_ms in spec.slos.thresholds_ms.items():
        for dialect in dialects:
            vllm = SLO_HISTOGRAMS[slo]
            metric = vllm if dialect is DIALECTS["vllm"] else dialect.histogram_for(vllm)
            if metric is None or boundary_index(threshold_ms / 1000.0, metric.buckets) is not None:
                continue
            where = "" if dialect.name == "vllm" else f" (entrypoint dialect {dialect.name})"
            warnings.append(
                f"{source}: slos.{slo}_ms: {not_a_boundary(threshold_ms, metric.name, metric.buckets)}"
                f"{where}; histogram-based goodput is interpolated there, exact only on a boundary")
    return warnings


@dataclass(frozen=True)
class Target:
    """One scrape target of the fleet and the labels it carries (the exporter's, the scrape config's)."""

    topology: str
    instance: str  # the spec's instance name (the `replica` label in Prometheus)
    role: str
    metrics_url: str
    gpus: int  # the instance's tensor-parallel size (0 for an entrypoint)
    dialect: str | None = None  # an entrypoint's catalog.DIALECTS name; None: detected from what it serves
    split_by: tuple[str, ...] = ()  # an entrypoint's labels kept on its request series (Entrypoint.split_by)

    @property
    def key(self) -> tuple[str, str]:
        return (self.topology, self.instance)


def spec_targets(spec: FleetSpec) -> list[Target]:
    """What the spec says to scrape: every instance's /metrics, then the topology's entrypoint
    metrics (role entrypoint, no GPUs) where it gives them."""
    out = []
    for topology in spec.topologies:
        out += [Target(topology.name, instance.name, instance.role.value, instance.url + "/metrics",
                       topology.tp_of(instance)) for instance in topology.instances]
        if topology.entrypoint.metrics_url is not None:
            out.append(Target(topology.name, entrypoint_replica(topology.name), ENTRYPOINT_ROLE,
                              topology.entrypoint.metrics_url, 0, topology.entrypoint.dialect,
                              tuple(topology.entrypoint.split_by)))
    return out
