"""All-reduce time by message size, and the TP step with its all-reduces, on N GPUs of one host.

    python benchmarks/allreduce_profile.py --tp 2,4,8 --out allreduce.csv   # on a host with 8 GPUs
    python benchmarks/allreduce_profile.py --smoke  # gloo on the CPU, TP 1 and 2, tiny sizes

For each TP size N it starts N processes itself (one per GPU, torch.distributed over NCCL, a loopback
rendezvous; no torchrun), with NVLink multicast off (NCCL_NVLS_ENABLE=0, as the simulator's figures
assume). It writes the CSV of benchmarks/gpu_profile.py with two kinds of rows:

- `allreduce`: one in-place BF16 all-reduce of `bytes` (1 KB to 256 MB, the note), timed as 20 of them
  captured in one CUDA graph, the median replay over 20; `crossover.sim.profile --allreduce` fits the
  spec's `allreduce_latency_us` and `allreduce_gbps` to them;
- `decode`, `prefill`, `mixed`: gpu_profile.py's own step of rank 0's shard (its `ShardModel`, in CUDA
  graphs), with an all-reduce after the attention and after the MLP projections of every layer, as the
  simulator counts them (the embedding's all-reduce and the logits' gather are left out, as there).

At N=1 no all-reduce runs, so the step rows are gpu_profile.py's for the same cells. Every rank times
the same number of replays (a fixed count, not a time target), as each replay is a collective.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import socket
import sys
import tempfile
from collections.abc import Sequence

import gpu_profile
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from figures import add_smoke_flag, print_figures, skipped
from gpu_profile import FIELDS, GIB, RESERVE_BYTES, SHAPES, Profile, Shard, ShardModel, Timer, row

SIZES = tuple(1024 * 4**i for i in range(10))  # 1 KB .. 256 MB
SMOKE_SIZES = (1024, 16384)
CALLS = 20  # all-reduces per captured graph: one is a few microseconds, below a replay's own cost


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def versions(device: torch.device) -> dict[str, str]:
    """gpu_profile.py's (card, driver, CUDA, torch) and the collective library's."""
    info = gpu_profile.versions(device)
    if device.type == "cuda":
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        info["nccl_nvls_enable"] = os.environ.get("NCCL_NVLS_ENABLE", "")
        info["gpus_on_host"] = str(torch.cuda.device_count())
    else:
        info["backend"] = "gloo"
    return info


def profile_allreduce(profile: Profile, device: torch.device, tp: int, sizes: Sequence[int]) -> None:
    for size in sizes:
        x = torch.zeros(size // 2, dtype=torch.bfloat16, device=device)  # zeros: the sums stay finite

        def many(x: torch.Tensor = x) -> torch.Tensor:
            for _ in range(CALLS):
                dist.all_reduce(x)
            return x

        profile.record(row("allreduce", tp=tp, note=f"bytes={size}"), many, divide=CALLS)


def worker(rank: int, tp: int, port: int, args: argparse.Namespace) -> None:
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=tp, **({"device_id": device} if cuda else {}))
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null if rank else sys.stdout):
        run_rank(rank, tp, device, args)  # rank 0 prints and writes for the group
    dist.destroy_process_group()


def run_rank(rank: int, tp: int, device: torch.device, args: argparse.Namespace) -> None:
    cuda = device.type == "cuda"
    small = not cuda
    if args.smoke:
        gpu_profile.use_smoke_sizes()
    timer = Timer(device, 1e9, args.reps)  # a time target this long: every rank replays `reps` times
    with open(args.out if rank == 0 else os.devnull, "a", newline="") as handle, \
            gpu_profile.fast_attention(device):
        writer = csv.DictWriter(handle, fieldnames=FIELDS)
        profile = Profile(writer, timer, math.inf, device)
        if tp > 1:
            profile_allreduce(profile, device, tp, SMOKE_SIZES if args.smoke else SIZES)
        for name in args.models.split(","):
            if SHAPES[name]["heads"] % tp:
                continue
            shard = Shard.of(name, tp)
            free = torch.cuda.mem_get_info(device)[0] if cuda else 8 * GIB
            room = free - shard.weight_bytes - (RESERVE_BYTES if cuda else 0)
            most = (256 * 8192 + 16384) // (16 if small else 1)
            # The smallest pool of any rank, so that every rank runs the same cells (each is a collective).
            kv = torch.tensor([max(0, min(int(room // shard.kv_bytes_per_token), most))], device=device)
            dist.all_reduce(kv, op=dist.ReduceOp.MIN)
            if not int(kv.item()):
                print(f"skip {name} tp={tp}: weights {shard.weight_bytes / GIB:.1f} GiB do not fit",
                      flush=True)
                continue
            print(f"== {name} tp={tp}: KV pool {int(kv.item())} tokens", flush=True)
            model = ShardModel(shard, device, int(kv.item()))
            model.probe_gqa()
            model.probe_late_attention(Timer(device, 0.02, 20))
            if tp > 1:
                def reduce(h: torch.Tensor) -> torch.Tensor:
                    dist.all_reduce(h)
                    return h

                model.reduce = reduce
            gpu_profile.profile_steps(profile, model, small)
            handle.flush()
            del model
            if cuda:
                torch.cuda.empty_cache()


def csv_figures(path: str) -> dict[str, object]:
    """Per TP size: the smallest message's all-reduce time, the largest's bus bandwidth (2(n-1)/n x bytes
    per second, the simulator's `allreduce_gbps`), and the number of step cells."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(line for line in handle if not line.startswith("#")))
    allreduce: dict[str, dict[str, float]] = {}
    steps: dict[str, int] = {}
    for r in rows:
        if r["kind"] == "allreduce":
            n, size, seconds = int(r["tp"]), int(r["note"].split("=", 1)[1]), float(r["step_ms"]) / 1000
            fig = allreduce.setdefault(r["tp"], {})
            if size <= fig.get("smallest_bytes", math.inf):
                fig.update(smallest_bytes=size, smallest_us=seconds * 1e6)
            if size >= fig.get("largest_bytes", 0):
                fig.update(largest_bytes=size, largest_bus_gbps=2 * (n - 1) / n * size / seconds / 1e9)
        else:
            steps[r["tp"]] = steps.get(r["tp"], 0) + 1
    return {"cells": len(rows), "steps": steps, "allreduce": allreduce}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--out", help="the CSV to write (required but with --smoke)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", default="llama-3.1-8b,llama-3.1-70b")
    parser.add_argument("--tp", default="2", help="TP sizes, comma-separated; each needs that many GPUs")
    parser.add_argument("--reps", type=int, default=20, help="timed replays per cell, on every rank")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # TP 2 where two ranks have a device each: the CPU, or two GPUs
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
        two = args.device == "cpu" or torch.cuda.device_count() >= 2
        args.models, args.tp, args.reps = "tiny", "1,2" if two else "1", 3
        args.out = args.out or os.path.join(tempfile.mkdtemp(prefix="allreduce-profile-"), "smoke.csv")
    elif not args.out:
        parser.error("--out is required")
    try:
        sizes = [int(t) for t in args.tp.split(",")]
    except ValueError:
        parser.error(f"--tp {args.tp!r}: want TP sizes such as 2,4,8")
    unknown = set(args.models.split(",")) - set(SHAPES)
    if unknown:
        parser.error(f"--models: unknown {', '.join(sorted(unknown))} (want {', '.join(SHAPES)})")
    gpus = torch.cuda.device_count() if args.device == "cuda" else math.inf
    if args.device == "cuda" and not gpus:
        parser.error("--device cuda: no CUDA GPU here (--smoke runs on the CPU)")
    if any(n < 1 or n > gpus for n in sizes) or args.reps < 1:
        parser.error(f"--tp {args.tp}: each size from 1 to the {gpus} GPUs here; --reps at least 1")
    if args.device == "cpu":
        skipped("CUDA: gloo on the CPU, plain calls at 1/16 of the shapes; the figures are no GPU's")
    os.environ["NCCL_NVLS_ENABLE"] = "0"  # before NCCL starts in the children, who inherit it
    device = torch.device(args.device)
    with open(args.out, "w", newline="") as handle:
        for key, value in versions(device).items():
            handle.write(f"# {key}: {value}\n")
        handle.write(f"# command: python benchmarks/allreduce_profile.py {' '.join(sys.argv[1:])}\n")
        csv.DictWriter(handle, fieldnames=FIELDS).writeheader()
    for tp in sizes:
        mp.spawn(worker, args=(tp, free_port(), args), nprocs=tp, join=True)
    print_figures(csv_figures(args.out))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    sys.exit(main())
