"""The performance model: how long one engine step of one instance takes, and how much KV fits.

Pure functions of the spec; docs/simulator.md gives the formulas and their sources. The engine
(live, wall-clock) and the ground-truth calculator (virtual time) both call `step_seconds`, so the
simulator serves exactly what the model predicts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crossover.spec import FleetSpec, Interconnect

# Per all-reduce latency (us) by TP size, the first seed's figures: NVLink ~60 us (TP2), ~100 us (TP4);
# PCIe 2-8 ms. Other sizes extrapolate the same way (see allreduce_latency_s).
_NVLINK_ALLREDUCE_US = {2: 60.0, 4: 100.0, 8: 180.0}
_PCIE_ALLREDUCE_US = {2: 2000.0, 4: 3000.0, 8: 8000.0}
_GIB = 1024**3


def allreduce_latency_s(interconnect: Interconnect, tensor_parallel_size: int,
                        override_us: float | None = None) -> float:
    """Latency of one all-reduce of a step's activations across the TP group."""
    if tensor_parallel_size <= 1:
        return 0.0
    if override_us is not None:
        return override_us * 1e-6
    table = _NVLINK_ALLREDUCE_US if interconnect is Interconnect.NVLINK else _PCIE_ALLREDUCE_US
    if tensor_parallel_size in table:
        return table[tensor_parallel_size] * 1e-6
    # Ring all-reduce latency grows about linearly with the number of ranks.
    per_rank = table[4] / 4
    return per_rank * tensor_parallel_size * 1e-6


def allreduce_bytes_s(interconnect_gbps: float | None, tensor_parallel_size: int,
                      message_bytes: float) -> float:
    """The size term of a ring all-reduce: each rank sends and receives 2(n-1)/n of the message."""
    if interconnect_gbps is None or tensor_parallel_size <= 1:
        return 0.0
    n = tensor_parallel_size
    return 2 * (n - 1) / n * message_bytes / (interconnect_gbps * 1e9)


@dataclass(frozen=True)
class Shard:
    """What one TP rank holds of a Llama-shaped model, and the fixed costs of its kernels (per-kernel model).

    A step runs per layer: four projections (QKV, output, gate/up, down) as GEMMs, decode attention (a
    split-KV kernel and its combine: two kernels), prefill attention, and the short elementwise kernels
    around them (norms, residual adds, rotary, KV-cache writes, SiLU-and-multiply); then the LM head
    over each sequence's last token. Figures from benchmarks/gpu_profile.py; docs/simulator.md.
    """

    layers: int
    hidden: int
    heads: int  # per rank
    kv_heads: int  # per rank (replicated when TP exceeds the KV heads)
    head_dim: int
    intermediate: int  # per rank
    vocab: int  # per rank
    dtype_bytes: float
    kernel_s: float
    small_kernel_s: float
    attention_flops_per_s: float
    decode_attention_s_per_token: float = 0.0
    attention_after_context_flops_per_s: float | None = None  # default attention_flops_per_s

    OUTPUT_COPY_KERNELS = 1  # per attention kind: its output's copy back to token-major order
    CACHE_WRITE_KERNELS = 2  # per attention kind: its K and V written into the cache
    # HBM passes over each short kernel group's width per token, from the profile's `elementwise` rows at
    # 8192 tokens (time x bandwidth / width): residual add + RMSNorm 5.6-6.1 passes of the hidden size,
    # rotary 25.7-26.5 of the Q and K heads, SiLU-and-multiply 10.9-11.6 of the intermediate size.
    ADD_NORM_PASSES = 6
    ROTARY_PASSES = 26
    SILU_MUL_PASSES = 11
    CACHE_WRITE_PASSES = 4  # K and V, each read and written
    # A short kernel over one token costs 0.81 of one over 2-64 tokens (the `elementwise` rows at 1 and 8
    # tokens, every shard): the batch-1 decode step is the one that gains.
    SINGLE_TOKEN_SMALL_KERNEL_SHARE = 0.81

    def gemm_s(self, tokens: int, n: int, k: int, hbm: float, flops: float) -> float:
        """One projection: weights + activations through HBM, or its FLOPs, whichever is longer."""
        moved = self.dtype_bytes * (n * k + tokens * (n + k))
        return self.kernel_s + max(moved / hbm, 2.0 * tokens * n * k / flops)

    def layer_s(self, load: StepLoad, hbm: float, flops: float) -> float:
        h, d, tokens = self.hidden, self.head_dim, load.decode_seqs + load.prefill_tokens
        qkv = (self.heads + 2 * self.kv_heads) * d
        gemms = (self.gemm_s(tokens, qkv, h, hbm, flops) + self.gemm_s(tokens, h, self.heads * d, hbm, flops)
                 + self.gemm_s(tokens, 2 * self.intermediate, h, hbm, flops)
                 + self.gemm_s(tokens, h, self.intermediate, hbm, flops))
        kv_token_bytes = 2 * self.kv_heads * d * self.dtype_bytes
        attention = 0.0
        if load.decode_seqs:
            # Split-KV decode streams the batch's KV at the HBM rate, but walks one sequence's context at a
            # fixed rate, which shows when the batch is too small to fill the GPU (the `attn_decode` rows).
            per_seq = load.decode_context_tokens / load.decode_seqs
            attention += 2 * self.kernel_s + overlap(load.decode_context_tokens * kv_token_bytes / hbm,
                                                     per_seq * self.decode_attention_s_per_token)
            attention += self.OUTPUT_COPY_KERNELS * self.small_kernel_s
        if load.prefill_tokens:
            attention += (2 * self.kernel_s + self.prefill_attention_flops_s(load)
                          + load.prefill_context_tokens * kv_token_bytes / hbm)
            attention += self.OUTPUT_COPY_KERNELS * self.small_kernel_s
        kinds = (load.decode_seqs > 0) + (load.prefill_tokens > 0)  # decode rows and a chunk write apart
        if kinds == 2:
            attention += self.small_kernel_s  # the two attention outputs joined into one
        return gemms + attention + self.elementwise_s(tokens, hbm, kinds)

    def prefill_attention_flops_s(self, load: StepLoad) -> float:
        """The chunks' causal pairs at the start-0 kernel's rate, their pairs over earlier context at the
        slower rate the `attn_prefill` rows after earlier context measure."""
        after = self.attention_after_context_flops_per_s or self.attention_flops_per_s
        within = load.prefill_attention_pairs - load.prefill_earlier_pairs
        return 4.0 * self.heads * self.head_dim * (within / self.attention_flops_per_s
                                                    + load.prefill_earlier_pairs / after)

    def elementwise_s(self, tokens: int, hbm: float, attention_kinds: int = 1) -> float:
        """The short kernels of a layer: each group's fixed cost overlapped with its HBM traffic."""
        d = self.head_dim
        one = self.small_kernel_s * (self.SINGLE_TOKEN_SMALL_KERNEL_SHARE if tokens == 1 else 1.0)
        per_token = tokens * self.dtype_bytes / hbm
        groups = ((2, self.ADD_NORM_PASSES * self.hidden), (2, self.ADD_NORM_PASSES * self.hidden),
                  (3, self.ROTARY_PASSES * (self.heads + self.kv_heads) * d),
                  (self.CACHE_WRITE_KERNELS * attention_kinds, self.CACHE_WRITE_PASSES * self.kv_heads * d),
                  (2, self.SILU_MUL_PASSES * self.intermediate))
        return sum(overlap(kernels * one, width * per_token) for kernels, width in groups)

    def step_s(self, load: StepLoad, hbm: float, flops: float) -> float:
        sequences = load.decode_seqs + load.prefill_seqs
        head = self.gemm_s(sequences, self.vocab, self.hidden, hbm, flops)
        return self.layers * self.layer_s(load, hbm, flops) + head


@dataclass(frozen=True)
class StepLoad:
    """What one engine step computes: decode tokens (one per decoding sequence) and prefill chunks."""

    decode_seqs: int = 0
    decode_context_tokens: int = 0  # KV tokens the decoding sequences attend over (read from HBM)
    prefill_tokens: int = 0
    prefill_attention_pairs: float = 0.0  # sum over prefill tokens of the context each attends to
    prefill_seqs: int = 0
    prefill_context_tokens: int = 0  # KV tokens the prefill chunks read (their start plus the chunk)
    prefill_earlier_pairs: float = 0.0  # of those pairs, the ones over earlier context (chunk x start)


@dataclass(frozen=True)
class PerfModel:
    """The roofline of one instance (one TP group) of the spec's model on the spec's GPU."""

    tensor_parallel_size: int
    layers: int
    hidden_size: int
    params: float  # parameters
    weight_bytes_per_gpu: float
    kv_bytes_per_token: float  # whole model (all TP shards)
    hbm_bytes_per_s: float  # achieved, per GPU
    flops_per_s: float  # achieved, per GPU
    allreduce_s: float
    gpu_time_scale: float
    host_step_s: float
    host_per_seq_s: float
    kv_capacity_tokens: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_link_bytes_per_s: float
    kv_link_latency_s: float
    shard: Shard | None = None  # the per-kernel model, when the hardware gives its kernel costs
    allreduce_gbps: float | None = None

    @classmethod
    def for_instance(cls, spec: FleetSpec, tensor_parallel_size: int) -> PerfModel:
        model, hardware, sim = spec.model, spec.hardware, spec.simulator
        tp = tensor_parallel_size
        weight_per_gpu = model.weight_bytes / tp
        usable_per_gpu = hardware.memory_gib * _GIB * hardware.gpu_memory_utilization
        kv_bytes_total = max(0.0, usable_per_gpu - weight_per_gpu) * tp
        block = sim.block_size
        capacity_blocks = int(kv_bytes_total // (model.kv_bytes_per_token * block))
        shard = None
        if hardware.kernel_us is not None and model.intermediate_size is not None:
            shard = Shard(
                layers=model.layers, hidden=model.hidden_size, heads=model.heads // tp,
                kv_heads=max(1, model.kv_heads // tp), head_dim=model.head_dim,
                intermediate=model.intermediate_size // tp, vocab=model.vocab_size // tp,
                dtype_bytes=model.dtype_bytes, kernel_s=hardware.kernel_us * 1e-6,
                small_kernel_s=(hardware.small_kernel_us or hardware.kernel_us) * 1e-6,
                attention_flops_per_s=hardware.bf16_tflops * 1e12 * hardware.attention_mfu,
                decode_attention_s_per_token=(hardware.decode_attention_ns_per_token or 0.0) * 1e-9,
                attention_after_context_flops_per_s=(None if hardware.attention_mfu_after_context is None
                                                     else hardware.bf16_tflops * 1e12
                                                     * hardware.attention_mfu_after_context))
        return cls(
            tensor_parallel_size=tp,
            layers=model.layers,
            hidden_size=model.hidden_size,
            params=model.params_b * 1e9,
            weight_bytes_per_gpu=weight_per_gpu,
            kv_bytes_per_token=model.kv_bytes_per_token,
            hbm_bytes_per_s=hardware.hbm_bandwidth_gbps * 1e9 * sim.hbm_efficiency,
            flops_per_s=hardware.bf16_tflops * 1e12 * sim.mfu,
            allreduce_s=allreduce_latency_s(hardware.interconnect, tp, hardware.allreduce_latency_us),
            gpu_time_scale=sim.gpu_time_scale,
            host_step_s=sim.host_overhead_step_us * 1e-6,
            host_per_seq_s=(sim.host_overhead_per_seq_us + sim.host_overhead_per_seq_per_rank_us * tp) * 1e-6,
            kv_capacity_tokens=capacity_blocks * block,
            block_size=block,
            max_num_seqs=sim.max_num_seqs,
            max_num_batched_tokens=sim.max_num_batched_tokens,
            kv_link_bytes_per_s=hardware.kv_link_gbps * 1e9,
            kv_link_latency_s=hardware.kv_link_latency_ms * 1e-3,
            shard=shard,
            allreduce_gbps=hardware.allreduce_gbps,
        )

    @property
    def tp_overhead_s(self) -> float:
        """Two all-reduces per layer per step (after attention and after the MLP)."""
        return self.layers * 2 * self.allreduce_s

    def step_seconds(self, load: StepLoad) -> float:
        """Duration of one engine step: GPU time per shard + TP all-reduces + host time."""
        tokens = load.decode_seqs + load.prefill_tokens
        if tokens == 0:
            return 0.0
        host = self.host_step_s + self.host_per_seq_s * (load.decode_seqs + load.prefill_seqs)
        if self.shard is not None:
            gpu = self.shard_gpu_seconds(load) + self.allreduce_seconds(tokens)
            return gpu * self.gpu_time_scale + host
        tp = self.tensor_parallel_size
        kv_tokens_touched = load.decode_context_tokens + load.prefill_tokens  # reads + new writes
        bytes_moved = self.weight_bytes_per_gpu + kv_tokens_touched * self.kv_bytes_per_token / tp
        attention_pairs = load.decode_context_tokens + load.prefill_attention_pairs
        flops = (2.0 * self.params * tokens + 4.0 * self.layers * self.hidden_size * attention_pairs) / tp
        gpu = max(bytes_moved / self.hbm_bytes_per_s, flops / self.flops_per_s)
        return (gpu + self.tp_overhead_s) * self.gpu_time_scale + host

    def shard_gpu_seconds(self, load: StepLoad) -> float:
        """The per-kernel model's GPU time of one rank's shard (what benchmarks/gpu_profile.py measures)."""
        if self.shard is None:
            raise ValueError("hardware.kernel_us: the per-kernel model needs the kernel costs")
        return self.shard.step_s(load, self.hbm_bytes_per_s, self.flops_per_s)

    def allreduce_seconds(self, tokens: int) -> float:
        """Two all-reduces per layer of the step's activations (tokens x hidden)."""
        message = tokens * self.hidden_size * (self.shard.dtype_bytes if self.shard else 2.0)
        size = allreduce_bytes_s(self.allreduce_gbps, self.tensor_parallel_size, message)
        return self.layers * 2 * (self.allreduce_s + size) if self.tensor_parallel_size > 1 else 0.0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def kv_capacity_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    def kv_transfer_seconds(self, prompt_tokens: int) -> float:
        """P/D: the prompt's KV (all layers, all shards) over the KV link, plus the link latency."""
        return self.kv_transfer_bytes(prompt_tokens) / self.kv_link_bytes_per_s + self.kv_link_latency_s

    def kv_transfer_bytes(self, prompt_tokens: int) -> float:
        return self.blocks_for(prompt_tokens) * self.block_size * self.kv_bytes_per_token


def overlap(fixed_s: float, streaming_s: float) -> float:
    """A kernel's fixed latency and its streaming time, partly hidden behind each other: the root of the
    sum of squares fits the `elementwise` and `attn_decode` rows (from 1 to 8192 tokens) better than
    their sum or their larger one."""
    return math.hypot(fixed_s, streaming_s)


def prefill_attention_pairs(start: int, chunk: int) -> float:
    """Sum over a causal prefill chunk's tokens of the context each attends to (start+1 .. start+chunk)."""
    return chunk * start + chunk * (chunk + 1) / 2.0
