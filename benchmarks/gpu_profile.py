"""GPU time of one engine step of one tensor-parallel rank's shard, measured with torch.

    python benchmarks/gpu_profile.py --out gpu_profile.csv                 # on a CUDA GPU
    python benchmarks/gpu_profile.py --device cpu --models tiny --out x.csv  # a quick check anywhere
    python benchmarks/gpu_profile.py --smoke  # a few cells of every part, on a GPU if there is one

A rank's shard of a Llama layer (RMSNorm, QKV projection, rotary, KV-cache write, attention, output
projection, RMSNorm, gate/up projection, SiLU-and-multiply, down projection) with random BF16 weights,
stacked to the model's depth, with the embedding and the LM head computing the logits of each
sequence's last token, as one vLLM engine step does. Every step is captured in a CUDA graph and its
replays timed with CUDA events (the median), so host launch time is out of the figure: vLLM's
host-side time per step is modelled apart. The all-reduces between ranks are not run (one GPU):
`ShardModel.reduce` is where benchmarks/allreduce_profile.py puts them, on several GPUs.

Rows (`kind`): `decode` (batch x context, one token per sequence), `prefill` (one chunk of a
sequence, starting at `prefill_start`), `mixed` (decode batch plus one prefill chunk: a chunked-prefill
step), and the ceilings the performance model stands on: `copy` (device-to-device bandwidth),
`gemm_peak` (an 8192^3 BF16 product), `kernel_floor` (the cost of one short kernel inside a graph),
`gemm` (one projection of every layer at a token count), `attn_decode` and `attn_prefill` (attention
alone). Comment lines (`# key: value`) at the top name the GPU, driver, CUDA, torch and the command.
Cells whose KV cache does not fit beside the shard's weights are left out, as vLLM would not run them.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from figures import add_smoke_flag, print_figures, skipped

SHAPES: dict[str, dict[str, int]] = {
    "llama-3.1-8b": dict(layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128,
                         intermediate=14336, vocab=128256),
    "llama-3.1-70b": dict(layers=80, hidden=8192, heads=64, kv_heads=8, head_dim=128,
                          intermediate=28672, vocab=128256),
    "tiny": dict(layers=2, hidden=256, heads=8, kv_heads=2, head_dim=32, intermediate=512, vocab=1000),
}
TP_SIZES = (1, 2, 4, 8)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (512, 1024, 2048, 4096, 8192)
PREFILL_CHUNKS = (256, 512, 1024, 2048, 4096, 8192)
PREFILL_LATE = ((2048, 6144), (512, 7680))  # (chunk, start): the later chunks of a long prompt
MIXED = ((16, 2048, 512), (64, 2048, 512), (128, 1024, 512), (32, 4096, 2048), (128, 2048, 2048),
         (256, 1024, 1024))  # (decode batch, decode context, prefill chunk), prefill at start 2048
MIXED_PREFILL_START = 2048
GEMM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
SHAPE_TOKENS = (1, 2, 4, 8, 16)  # the `shapes` part: where a single-token GEMV gives way to a GEMM
SHAPE_DECODE = tuple((b, c) for c in (512, 2048, 8192) for b in (1, 2, 4, 8, 16))
ELEMENTWISE_TOKENS = (1, 8, 64, 512, 8192)
ATTN_DECODE = ((1, 512), (1, 8192), (8, 2048), (32, 1024), (32, 8192), (64, 4096), (128, 2048), (256, 512),
               (256, 2048))
GIB = 1024**3
RESERVE_BYTES = 8 * GIB  # activations, graph pools, cuBLAS workspaces


@dataclass(frozen=True)
class Shard:
    """The dimensions one TP rank holds."""

    model: str
    tp: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, model: str, tp: int) -> Shard:
        s = SHAPES[model]
        return cls(model, tp, s["layers"], s["hidden"], s["heads"] // tp, max(1, s["kv_heads"] // tp),
                   s["head_dim"], s["intermediate"] // tp, s["vocab"] // tp)

    @property
    def qkv_out(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim

    @property
    def layer_weight_elems(self) -> int:
        return (self.hidden * self.qkv_out + self.heads * self.head_dim * self.hidden
                + 3 * self.hidden * self.intermediate + 2 * self.hidden)

    @property
    def weight_bytes(self) -> int:
        return 2 * (self.layers * self.layer_weight_elems + 2 * self.vocab * self.hidden + self.hidden)

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2


class Timer:
    """Times a step: CUDA graph replays with events on a GPU, plain calls on the CPU."""

    def __init__(self, device: torch.device, target_s: float, max_reps: int) -> None:
        self.device, self.target_s, self.max_reps = device, target_s, max_reps

    def __call__(self, fn: Callable[[], torch.Tensor]) -> tuple[float, int]:
        if self.device.type != "cuda":
            fn()
            times = []
            for _ in range(3):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            return statistics.median(times), len(times)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        estimate = start.elapsed_time(end) / 1000
        reps = max(3, min(self.max_reps, int(self.target_s / max(estimate, 1e-6))))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for a, b in events:
            a.record()
            graph.replay()
            b.record()
        torch.cuda.synchronize()
        if not bool(torch.isfinite(out.float()).all()):
            raise RuntimeError("non-finite output")
        del graph, out
        return statistics.median(a.elapsed_time(b) for a, b in events) / 1000, reps


class ShardModel:
    """Random BF16 weights and a KV pool for one shard; `step` runs one engine step on it."""

    def __init__(self, shard: Shard, device: torch.device, kv_tokens: int) -> None:
        self.s, self.device = shard, device
        dt = torch.bfloat16

        def w(*shape: int) -> torch.Tensor:
            return torch.empty(*shape, device=device, dtype=dt).normal_(0.0, 0.02)

        s = shard
        self.layers = [dict(norm1=1 + w(s.hidden), qkv=w(s.qkv_out, s.hidden),
                            o=w(s.hidden, s.heads * s.head_dim), norm2=1 + w(s.hidden),
                            gate_up=w(2 * s.intermediate, s.hidden), down=w(s.hidden, s.intermediate))
                       for _ in range(s.layers)]
        self.embed = w(s.vocab, s.hidden)
        self.lm_head = w(s.vocab, s.hidden)
        self.final_norm = 1 + w(s.hidden)
        self.kv_tokens = kv_tokens
        # One K and one V pool per layer, [token, kv_head, head_dim]; a cell views its sequences in it.
        self.k_pool = [w(kv_tokens, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        self.v_pool = [w(kv_tokens, s.kv_heads, s.head_dim) for _ in range(s.layers)]
        max_pos = 16384
        inv = 1.0 / (500000.0 ** (torch.arange(0, s.head_dim, 2, device=device).float() / s.head_dim))
        freqs = torch.outer(torch.arange(max_pos, device=device).float(), inv)
        angles = torch.cat([freqs, freqs], dim=-1)
        self.cos = angles.cos().to(dt)
        half = s.head_dim // 2
        sin = angles.sin()
        self.sin_signed = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(dt)
        self.gqa_native = True
        self.decode_backend: object = None
        self.decode_choice: dict[tuple[int, int], object] = {}
        self.late_kernel = "LOWER_RIGHT_MASK"
        # The TP all-reduce after the attention and the MLP projections: none on one GPU (no kernel, so
        # the step is the single-rank shard's); allreduce_profile.py sets it to torch.distributed's.
        self.reduce: Callable[[torch.Tensor], torch.Tensor] = lambda h: h

    def decode_kernel(self) -> contextlib.AbstractContextManager[None]:
        if self.decode_backend is None:
            return contextlib.nullcontext()
        from torch.nn.attention import sdpa_kernel
        return sdpa_kernel([self.decode_backend])

    def probe_gqa(self) -> None:
        """Use the attention kernels' own grouped-query support where this torch has it."""
        s, dev = self.s, self.device
        q = torch.randn(1, s.heads, 64, s.head_dim, device=dev, dtype=torch.bfloat16)
        kv = torch.randn(1, s.kv_heads, 64, s.head_dim, device=dev, dtype=torch.bfloat16)
        try:
            self._prefill_attention(q, kv, kv, 0)
        except (RuntimeError, TypeError) as exc:
            print(f"grouped-query attention by repeating K/V ({exc})".splitlines()[0], flush=True)
            self.gqa_native = False

    def rotary(self, qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return torch.addcmul(qk * cos, qk.roll(self.s.head_dim // 2, dims=-1), sin)

    def choose_decode_backend(self, timer: Timer, batch: int, context: int) -> str:
        """Decode attention through the faster of torch's two fused kernels at this batch shape.

        FlashAttention splits a long context across multiprocessors (fast at small batches) and cuDNN's
        kernel streams large batches closer to the HBM rate; vLLM's own kernel does both.
        """
        if self.device.type != "cuda" or not batch:
            return ""
        if (batch, context) in self.decode_choice:
            self.decode_backend = self.decode_choice[(batch, context)]
            return str(self.decode_backend).split(".")[-1]
        from torch.nn.attention import SDPBackend, sdpa_kernel
        s = self.s
        q = torch.randn(batch, s.kv_heads, s.heads // s.kv_heads, s.head_dim, device=self.device,
                        dtype=torch.bfloat16)
        kd = self.k_pool[0][:batch * context].view(batch, context, s.kv_heads, s.head_dim).transpose(1, 2)
        vd = self.v_pool[0][:batch * context].view(batch, context, s.kv_heads, s.head_dim).transpose(1, 2)
        times = {}
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            try:
                with sdpa_kernel([backend]):
                    times[backend], _ = timer(lambda: F.scaled_dot_product_attention(q, kd, vd))
            except RuntimeError:
                continue
        self.decode_backend = min(times, key=lambda k: times[k]) if times else None
        self.decode_choice[(batch, context)] = self.decode_backend
        return str(self.decode_backend).split(".")[-1]

    def probe_late_attention(self, timer: Timer) -> str:
        """Pick the kernel for a chunk that starts after earlier context, as vLLM's would run it.

        vLLM runs one kernel with the causal mask aligned bottom-right (FlashAttention 3 on Hopper), at the
        rate of a chunk that starts at zero. torch's SDPA sends a bottom-right mask to its memory-efficient
        kernel, and FlashAttention 2's own bottom-right path is an Ampere kernel: both run at about 320
        TFLOP/s on an H200, where a chunk at zero runs near 550. So the candidates are those two and the same
        math in two calls of one fused kernel (the chunk over the earlier context, unmasked; the chunk over
        itself, causal) merged by their log-sum-exps, through cuDNN (with K/V repeated per query head if
        it takes no grouped heads, the copy timed too) or FlashAttention. Each is checked
        against the masked reference; the fastest exact one at a 2048-token chunk after 6144 is used.
        """
        s, dev = self.s, self.device
        gen = torch.Generator(device=dev).manual_seed(0)
        q = torch.randn(1, s.heads, 96, s.head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, s.kv_heads, 256, s.head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, s.kv_heads, 256, s.head_dim, device=dev, dtype=torch.bfloat16, generator=gen)
        self.late_kernel = "LOWER_RIGHT_MASK"
        reference = self._prefill_attention(q, k, v, 160).float()
        chunk, start = PREFILL_LATE[0]
        if self.device.type != "cuda":
            chunk, start = chunk // 16, start // 16
        qt = torch.randn(1, s.heads, chunk, s.head_dim, device=dev, dtype=torch.bfloat16)
        kt = self.k_pool[0][:start + chunk].unsqueeze(0).transpose(1, 2)
        vt = self.v_pool[0][:start + chunk].unsqueeze(0).transpose(1, 2)
        times: dict[str, float] = {}
        for kernel in ("LOWER_RIGHT_MASK", "FLASH_BOTTOM_RIGHT", "CUDNN_SPLIT", "CUDNN_SPLIT_REPEAT",
                       "FLASH_SPLIT"):
            self.late_kernel = kernel
            try:
                error = float((self._prefill_attention(q, k, v, 160).float() - reference).abs().max())
                if error < 0.03:
                    times[kernel], _ = timer(lambda: self._prefill_attention(qt, kt, vt, start))
            except (RuntimeError, TypeError, AttributeError, NotImplementedError) as exc:
                print(f"late attention {kernel}: {exc}".splitlines()[0], flush=True)
                continue
            print(f"late attention {kernel}: max |error| {error:.4f}, "
                  f"{times.get(kernel, float('nan')) * 1e3:.3f} ms at {chunk} after {start}", flush=True)
        self.late_kernel = min(times, key=lambda name: times[name]) if times else "LOWER_RIGHT_MASK"
        return self.late_kernel

    def _flash_bottom_right(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # FlashAttention 2 aligns a causal mask bottom-right when the chunk is shorter than its keys.
        qf, kf, vf = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [1, S, H, D]
        out = torch.ops.aten._flash_attention_forward(qf, kf, vf, None, None, qf.shape[1], kf.shape[1], 0.0,
                                                       True, False)[0]
        return out.transpose(1, 2)

    def _with_lse(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention and its log-sum-exp per query row, [1, H, P], through the late kernel's fused op."""
        if self.device.type != "cuda" or self.late_kernel == "CUDNN_SPLIT_REPEAT":
            group = q.shape[1] // k.shape[1]  # K/V repeated per query head: the copy is in the time
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        if self.device.type != "cuda":
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)[:2]
        elif self.late_kernel.startswith("CUDNN_SPLIT"):
            cudnn = torch.ops.aten._scaled_dot_product_cudnn_attention
            out, lse = cudnn(q, k, v, None, True, 0.0, causal)[:2]
        else:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[:2]
        return out, lse.reshape(q.shape[:3])

    def _split_merge(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
        early, early_lse = self._with_lse(q, k[:, :, :start], v[:, :, :start], False)
        own, own_lse = self._with_lse(q, k[:, :, start:], v[:, :, start:], True)
        # softmax over both parts: weight of the earlier part = sigmoid(lse_early - lse_own)
        weight = torch.sigmoid(early_lse - own_lse).unsqueeze(-1).to(q.dtype)
        return torch.lerp(own, early, weight)

    def _prefill_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           start: int) -> torch.Tensor:
        # q [1, H, P, D]; k, v [1, Hkv, start+P, D]; causal, aligned bottom-right when start > 0.
        if start and self.late_kernel == "FLASH_BOTTOM_RIGHT":
            return self._flash_bottom_right(q, k, v)
        if start and self.late_kernel.endswith(("_SPLIT", "_SPLIT_REPEAT")):
            return self._split_merge(q, k, v, start)
        causal: dict[str, object]
        if start == 0:
            causal = dict(is_causal=True)
        else:
            from torch.nn.attention.bias import causal_lower_right
            causal = dict(attn_mask=causal_lower_right(q.shape[2], k.shape[2]))
        if self.gqa_native:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **causal)
        group = q.shape[1] // k.shape[1]
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1),
                                              **causal)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, batch: int,
                  context: int, chunk: int, start: int) -> torch.Tensor:
        """Write this step's K/V into the pool and attend; decode rows first, then the prefill chunk."""
        s = self.s
        kp, vp = self.k_pool[layer], self.v_pool[layer]
        outs = []
        if batch:
            kd = kp[:batch * context].view(batch, context, s.kv_heads, s.head_dim)
            vd = vp[:batch * context].view(batch, context, s.kv_heads, s.head_dim)
            kd[:, context - 1] = k[:batch]
            vd[:, context - 1] = v[:batch]
            group = s.heads // s.kv_heads
            qd = q[:batch].view(batch, s.kv_heads, group, s.head_dim)
            with self.decode_kernel():
                out = F.scaled_dot_product_attention(qd, kd.transpose(1, 2), vd.transpose(1, 2))
            outs.append(out.reshape(batch, s.heads * s.head_dim))
        if chunk:
            base = batch * context
            kc = kp[base:base + start + chunk]
            vc = vp[base:base + start + chunk]
            kc[start:] = k[batch:]
            vc[start:] = v[batch:]
            qc = q[batch:].view(1, chunk, s.heads, s.head_dim).transpose(1, 2)
            out = self._prefill_attention(qc, kc.unsqueeze(0).transpose(1, 2),
                                          vc.unsqueeze(0).transpose(1, 2),
                                          start)
            outs.append(out.transpose(1, 2).reshape(chunk, s.heads * s.head_dim))
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def step(self, tokens: torch.Tensor, positions: torch.Tensor, batch: int, context: int, chunk: int,
             start: int) -> torch.Tensor:
        s = self.s
        eps = 1e-5
        residual = F.embedding(tokens, self.embed)
        h = F.rms_norm(residual, (s.hidden,), self.layers[0]["norm1"], eps)
        k_end = (s.heads + s.kv_heads) * s.head_dim
        cos = self.cos[positions].unsqueeze(1)  # the same for every layer: gathered once per step
        sin = self.sin_signed[positions].unsqueeze(1)
        for index, layer in enumerate(self.layers):
            if index:
                residual = residual + h
                h = F.rms_norm(residual, (s.hidden,), layer["norm1"], eps)
            qkv = F.linear(h, layer["qkv"])
            qk = self.rotary(qkv[:, :k_end].view(-1, s.heads + s.kv_heads, s.head_dim), cos, sin)
            q, k = qk[:, :s.heads], qk[:, s.heads:]
            v = qkv[:, k_end:].view(-1, s.kv_heads, s.head_dim)
            attn = self.attention(index, q, k, v, batch, context, chunk, start)
            h = self.reduce(F.linear(attn, layer["o"]))
            residual = residual + h
            h = F.rms_norm(residual, (s.hidden,), layer["norm2"], eps)
            gate_up = F.linear(h, layer["gate_up"])
            h = self.reduce(F.linear(F.silu(gate_up[:, :s.intermediate]) * gate_up[:, s.intermediate:],
                                     layer["down"]))
        residual = residual + h
        # Logits for each sequence's last token: every decode row and the chunk's last row.
        last = torch.cat([residual[:batch], residual[-1:]]) if chunk else residual
        return F.linear(F.rms_norm(last, (s.hidden,), self.final_norm, eps), self.lm_head)


def inputs(model: ShardModel, batch: int, context: int, chunk: int, start: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    dev = model.device
    tokens = torch.randint(0, model.s.vocab, (batch + chunk,), device=dev)
    positions = torch.cat([torch.full((batch,), context - 1, device=dev, dtype=torch.long),
                           torch.arange(start, start + chunk, device=dev)])
    return tokens, positions


class Profile:
    def __init__(self, writer: csv.DictWriter, timer: Timer, deadline: float, device: torch.device) -> None:
        self.writer, self.timer, self.deadline, self.device = writer, timer, deadline, device

    def out_of_time(self) -> bool:
        return time.monotonic() > self.deadline

    def record(self, row: dict[str, object], fn: Callable[[], torch.Tensor], divide: int = 1) -> None:
        if self.out_of_time():
            return
        try:
            seconds, reps = self.timer(fn)
        except torch.OutOfMemoryError:
            print(f"skip (out of memory): {row}", file=sys.stderr)
            torch.cuda.empty_cache()
            return
        row = dict(row, step_ms=f"{seconds / divide * 1000:.4f}", reps=reps)
        self.writer.writerow(row)
        print(" ".join(f"{k}={v}" for k, v in row.items() if v not in ("", None)), flush=True)


FIELDS = ("kind", "model", "tp", "batch", "context", "prefill_tokens", "prefill_start", "op", "tokens",
          "step_ms", "reps", "note")


def row(kind: str, shard: Shard | None = None, **fields: object) -> dict[str, object]:
    base: dict[str, object] = {k: "" for k in FIELDS}
    base["kind"] = kind
    if shard is not None:
        base["model"], base["tp"] = shard.model, shard.tp
    base.update(fields)
    return base


def ceilings(profile: Profile, device: torch.device, small: bool) -> None:
    n = (1 << 20) if small else (1 << 31)  # bytes per copy buffer: 2 GiB on a GPU
    src = torch.empty(n // 2, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    profile.record(row("copy", note=f"bytes_moved={2 * n}"), lambda: dst.copy_(src))
    m = 256 if small else 8192
    a = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    b = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    profile.record(row("gemm_peak", note=f"flops={2 * m**3}"), lambda: a @ b)
    kernels = 50 if small else 2000
    x = torch.randn(4096, device=device, dtype=torch.bfloat16)

    def many() -> torch.Tensor:
        for _ in range(kernels):
            x.mul_(1.0)
        return x

    profile.record(row("kernel_floor", note=f"kernels={kernels}"), many, divide=kernels)


def profile_steps(profile: Profile, model: ShardModel, small: bool, late_only: bool = False) -> None:
    """The step cells; `late_only`: just those with a prefill chunk after earlier context."""
    s = model.s
    cap = model.kv_tokens
    probe = Timer(model.device, 0.02, 20)

    def cell(kind: str, batch: int, context: int, chunk: int, start: int) -> None:
        if batch * context + start + chunk > cap or (late_only and not start):
            return
        tokens, positions = inputs(model, batch, context, chunk, start)
        kernel = "+".join(k for k in (model.choose_decode_backend(probe, batch, context),
                                      model.late_kernel if start else "") if k)
        profile.record(row(kind, s, batch=batch, context=context, prefill_tokens=chunk, prefill_start=start,
                           tokens=batch + chunk, note=kernel),
                       lambda: model.step(tokens, positions, batch, context, chunk, start))

    scale = 16 if small else 1
    for context in DECODE_CONTEXTS:
        for batch in DECODE_BATCHES:
            cell("decode", batch, context // scale, 0, 0)
    for chunk in PREFILL_CHUNKS:
        cell("prefill", 0, 0, chunk // scale, 0)
    for chunk, start in PREFILL_LATE:
        cell("prefill", 0, 0, chunk // scale, start // scale)
    for batch, context, chunk in MIXED:
        cell("mixed", batch, context // scale, chunk // scale, MIXED_PREFILL_START // scale)


def profile_gemms(profile: Profile, model: ShardModel, small: bool, token_counts: tuple[int, ...]) -> None:
    """Each projection alone, over every layer's own weights (so no layer's weights are found in L2)."""
    s = model.s
    scale = 16 if small else 1
    for name in ("qkv", "o", "gate_up", "down", "lm_head"):
        weights = [model.lm_head] if name == "lm_head" else [layer[name] for layer in model.layers]
        for tokens in token_counts:
            tokens = max(1, tokens // scale)
            xs = torch.randn(tokens, weights[0].shape[1], device=model.device, dtype=torch.bfloat16)

            def gemms(ws: list[torch.Tensor] = weights, x: torch.Tensor = xs) -> torch.Tensor:
                out = x
                for w_ in ws:
                    out = F.linear(x, w_)
                return out

            profile.record(row("gemm", s, op=name, tokens=tokens,
                               note=f"n={weights[0].shape[0]} k={weights[0].shape[1]}"), gemms,
                           divide=len(weights))


def profile_decode_attention(profile: Profile, model: ShardModel, small: bool,
                             shapes: tuple[tuple[int, int], ...]) -> None:
    s = model.s
    scale = 16 if small else 1
    for batch, context in shapes:
        context //= scale
        if batch * context > model.kv_tokens:
            continue
        group = s.heads // s.kv_heads
        q = torch.randn(batch, s.kv_heads, group, s.head_dim, device=model.device, dtype=torch.bfloat16)

        def attn(b: int = batch, c: int = context, q_: torch.Tensor = q) -> torch.Tensor:
            out = q_
            for layer in range(s.layers):
                kd = model.k_pool[layer][:b * c].view(b, c, s.kv_heads, s.head_dim).transpose(1, 2)
                vd = model.v_pool[layer][:b * c].view(b, c, s.kv_heads, s.head_dim).transpose(1, 2)
                with model.decode_kernel():
                    out = F.scaled_dot_product_attention(q_, kd, vd)
            return out

        kernel = model.choose_decode_backend(Timer(model.device, 0.02, 20), batch, context)
        profile.record(row("attn_decode", s, batch=batch, context=context, note=kernel), attn,
                       divide=s.layers)


def profile_prefill_attention(profile: Profile, model: ShardModel, small: bool,
                              chunks: tuple[tuple[int, int], ...]) -> None:
    s = model.s
    scale = 16 if small else 1
    for chunk, start in chunks:
        chunk //= scale
        start //= scale
        q = torch.randn(1, s.heads, chunk, s.head_dim, device=model.device, dtype=torch.bfloat16)

        def attn_p(c: int = chunk, b: int = start, q_: torch.Tensor = q) -> torch.Tensor:
            out = q_
            for layer in range(s.layers):
                k = model.k_pool[layer][:b + c].unsqueeze(0).transpose(1, 2)
                v = model.v_pool[layer][:b + c].unsqueeze(0).transpose(1, 2)
                out = model._prefill_attention(q_, k, v, b)
            return out

        profile.record(row("attn_prefill", s, prefill_tokens=chunk, prefill_start=start,
                           note=model.late_kernel if start else ""), attn_p, divide=s.layers)


def profile_elementwise(profile: Profile, model: ShardModel, small: bool) -> None:
    """The short kernels of a layer as the step runs them, every layer's worth, per token count."""
    s = model.s
    dev, dt, eps = model.device, torch.bfloat16, 1e-5
    k_end = (s.heads + s.kv_heads) * s.head_dim
    for tokens in ELEMENTWISE_TOKENS:
        tokens = max(1, tokens // (16 if small else 1))
        residual = torch.randn(tokens, s.hidden, device=dev, dtype=dt)
        h = torch.randn(tokens, s.hidden, device=dev, dtype=dt)
        qkv = torch.randn(tokens, s.qkv_out, device=dev, dtype=dt)
        gate_up = torch.randn(tokens, 2 * s.intermediate, device=dev, dtype=dt)
        positions = torch.arange(tokens, device=dev)
        cos = model.cos[positions].unsqueeze(1)
        sin = model.sin_signed[positions].unsqueeze(1)
        def add_norm(r: torch.Tensor = residual, x: torch.Tensor = h,
                     weight: torch.Tensor = model.layers[0]["norm1"]) -> torch.Tensor:
            out = x
            for _ in range(s.layers):
                out = F.rms_norm(r + x, (s.hidden,), weight, eps)
            return out

        def rotary(x: torch.Tensor = qkv, c: torch.Tensor = cos, si: torch.Tensor = sin) -> torch.Tensor:
            out = x
            for _ in range(s.layers):
                out = model.rotary(x[:, :k_end].view(-1, s.heads + s.kv_heads, s.head_dim), c, si)
            return out

        def silu_mul(x: torch.Tensor = gate_up) -> torch.Tensor:
            out = x
            for _ in range(s.layers):
                out = F.silu(x[:, :s.intermediate]) * x[:, s.intermediate:]
            return out

        for name, fn in (("add_norm", add_norm), ("rotary", rotary), ("silu_mul", silu_mul)):
            profile.record(row("elementwise", s, op=name, tokens=tokens), fn, divide=s.layers)


def profile_ops(profile: Profile, model: ShardModel, small: bool) -> None:
    """The pieces the performance model stands on."""
    profile_gemms(profile, model, small, GEMM_TOKENS)
    profile_decode_attention(profile, model, small, ATTN_DECODE)
    profile_prefill_attention(profile, model, small, tuple((c, 0) for c in PREFILL_CHUNKS) + PREFILL_LATE)
    profile_elementwise(profile, model, small)


@contextlib.contextmanager
def fast_attention(device: torch.device) -> Iterator[None]:
    """On a GPU, never let attention fall back to the math kernel (it would materialise the scores)."""
    if device.type != "cuda":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
    with sdpa_kernel(fused):
        yield


def versions(device: torch.device) -> dict[str, str]:
    info = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=props.name, sm_count=str(props.multi_processor_count),
                    memory_gib=f"{props.total_memory / GIB:.1f}", cudnn=str(torch.backends.cudnn.version()))
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
            info["nvidia_smi"] = smi.stdout.strip()
    else:
        info["gpu"] = "cpu"
    return info


def use_smoke_sizes() -> None:
    """Every part with a cell or two of each kind: the same functions over shorter shape tables."""
    globals().update(
        DECODE_BATCHES=(1, 8), DECODE_CONTEXTS=(512, 2048), PREFILL_CHUNKS=(256, 1024), MIXED=MIXED[:1],
        GEMM_TOKENS=(1, 256), SHAPE_TOKENS=(1, 2), SHAPE_DECODE=((1, 512), (2, 512)),
        ELEMENTWISE_TOKENS=(1, 512), ATTN_DECODE=((1, 512), (8, 2048)))


def csv_figures(path: str) -> dict[str, object]:
    """The profile's summary figures, read back from the CSV it wrote."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    figures: dict[str, object] = {"cells": len(rows), "kinds": kinds}
    for row in rows:
        seconds = float(row["step_ms"]) / 1000
        note = dict(part.split("=", 1) for part in row["note"].split() if "=" in part)
        if row["kind"] == "copy":
            figures["copy_gb_per_s"] = int(note["bytes_moved"]) / seconds / 1e9
        elif row["kind"] == "gemm_peak":
            figures["gemm_peak_tflops"] = int(note["flops"]) / seconds / 1e12
        elif row["kind"] == "kernel_floor":
            figures["kernel_floor_us"] = seconds * 1e6
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", help="the CSV to write (required but with --smoke)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="llama-3.1-8b,llama-3.1-70b")
    parser.add_argument("--tp", default=",".join(map(str, TP_SIZES)))
    parser.add_argument("--parts", default="ceilings,steps,ops",
                        help="which of ceilings, steps, ops; or late (the steps whose chunk starts after "
                             "earlier context, and their attention), shapes (GEMMs at 1-16 tokens, "
                             "small-batch decode attention), elementwise (the short kernels)")
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting cells after this")
    parser.add_argument("--target-s", type=float, default=0.2, help="timed replays per cell, in seconds")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # the tiny model at TP 2, every part, a few shapes each
        use_smoke_sizes()
        args.models, args.tp, args.parts = "tiny", "2", "ceilings,steps,ops,late,shapes,elementwise"
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        args.out = args.out or os.path.join(tempfile.mkdtemp(prefix="gpu-profile-"), "smoke.csv")
    elif not args.out:
        parser.error("--out is required")
    device = torch.device(args.device)
    small = device.type != "cuda"
    if small:
        skipped(f"CUDA (device {args.device}): cells are timed with plain calls at 1/16 of the shapes, "
                "not CUDA graphs with events; the figures are no GPU's")
    parts = set(args.parts.split(","))
    deadline = time.monotonic() + args.budget_s
    with open(args.out, "w", newline="") as handle, fast_attention(device):
        for key, value in versions(device).items():
            handle.write(f"# {key}: {value}\n")
        handle.write(f"# command: python benchmarks/gpu_profile.py {' '.join(sys.argv[1:])}\n")
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        writer.writeheader()
        profile = Profile(writer, Timer(device, args.target_s, 50), deadline, device)
        if "ceilings" in parts:
            ceilings(profile, device, small)
        for name in args.models.split(","):
            for tp in (int(t) for t in args.tp.split(",")):
                shard = Shard.of(name, tp)
                if SHAPES[name]["heads"] % tp or profile.out_of_time():
                    continue
                free = (torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else 8 * GIB)
                room = free - shard.weight_bytes - (RESERVE_BYTES if device.type == "cuda" else 0)
                if room <= 0:
                    print(f"skip {name} tp={tp}: weights {shard.weight_bytes / GIB:.1f} GiB do not fit",
                          flush=True)
                    continue
                most = (256 * 8192 + 16384) // (16 if small else 1)
                kv_tokens = min(int(room // shard.kv_bytes_per_token), most)
                print(f"== {name} tp={tp}: weights {shard.weight_bytes / GIB:.1f} GiB, "
                      f"KV pool {kv_tokens} tokens", flush=True)
                model = ShardModel(shard, device, kv_tokens)
                model.probe_gqa()
                model.probe_late_attention(Timer(device, 0.02, 20))
                if "steps" in parts:
                    profile_steps(profile, model, small)
                if "late" in parts:
                    profile_steps(profile, model, small, late_only=True)
                    profile_prefill_attention(profile, model, small, PREFILL_LATE)
                if "shapes" in parts:
                    profile_gemms(profile, model, small, SHAPE_TOKENS)
                    profile_decode_attention(profile, model, small, SHAPE_DECODE)
                if "elementwise" in parts:
                    profile_elementwise(profile, model, small)
                if "ops" in parts:
                    profile_ops(profile, model, small)
                handle.flush()
                del model
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if profile.out_of_time():
            print("budget reached: later cells left out", flush=True)
    print_figures(csv_figures(args.out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.exit(main())
