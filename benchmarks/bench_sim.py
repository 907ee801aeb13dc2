"""Simulator throughput benchmark: concurrent streams, streamed tokens/s per server core, and the gap
between each token's scheduled emission (its step's modelled end) and the moment it was written.

    python benchmarks/bench_sim.py [--streams 2000] [--instances 8] [--step-ms 40] [--duration 20]

One `crossover sim` server process (N colocated instances of a synthetic spec whose steps take a fixed
time) and one client process (this one: asyncio protocols, closed loop, keep-alive, counting SSE
chunks). Server CPU comes from /proc, so tokens per server CPU-second is measured, not assumed.
Targets (issue 3): >= 2,000 concurrent streams, >= 50,000 streamed tokens/s per core, p99 gap <= 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

import yaml

TARGET_STREAMS = 2000
TARGET_TOKENS_PER_CORE = 50_000
TARGET_GAP_P99_S = 0.002


def bench_spec(instances: int, step_ms: float) -> dict[str, object]:
    """A fleet whose every step takes step_ms regardless of batch (host time only), so the offered load
    is streams / step time tokens/s, and nothing but the simulator's own overhead limits it."""
    def port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])
    return {
        "model": {"name": "bench", "params_b": 0.001, "layers": 1, "hidden_size": 64, "heads": 1,
                  "kv_heads": 1, "max_model_len": 4096},
        "hardware": {"memory_gib": 80, "hbm_bandwidth_gbps": 3000, "bf16_tflops": 1000},
        "topologies": [{"name": "bench", "gpus": instances, "tensor_parallel_size": 1,
                        "instances": [{"name": f"b{i}", "url": f"http://127.0.0.1:{port()}"}
                                      for i in range(instances)]}],
        "slos": {"tpot_ms": 50},
        "simulator": {"gpu_time_scale": 1e-6, "host_overhead_step_us": step_ms * 1000,
                      "max_num_seqs": 100_000, "max_num_batched_tokens": 1_000_000},
    }


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Stream(asyncio.Protocol):
    """One keep-alive connection sending the next streamed completion when the last one ends."""

    def __init__(self, request: bytes, counts: list[int]) -> None:
        self.request = request
        self.counts = counts  # [tokens, requests]
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.counts[0] += data.count(b"data: {")
        window = self.tail + data[-16:]
        if window.endswith(b"\r\n0\r\n\r\n"):
            self.counts[1] += 1
            assert self.transport is not None
            self.transport.write(self.request)
        self.tail = window[-16:]

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts[2] += 1


async def drive(urls: list[str], streams: int, output_tokens: int, warmup: float, duration: float,
                server_pid: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    counts = [0, 0, 0]
    body = json.dumps({"model": "bench", "prompt": "a b c d", "max_tokens": output_tokens,
                       "ignore_eos": True, "stream": True}).encode()
    transports = []
    for index in range(streams):
        host, port = urls[index % len(urls)].rsplit("/", 1)[-1].split(":")
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        transport, _ = await loop.create_connection(partial(Stream, request, counts), host, int(port))
        transports.append(transport)
        if index % 100 == 99:
            await asyncio.sleep(0.01)  # let the server accept in batches, as clients arrive in life
    await asyncio.sleep(warmup)
    tokens0, requests0, cpu0, wall0 = counts[0], counts[1], cpu_seconds(server_pid), time.monotonic()
    client_cpu0 = time.process_time()
    await asyncio.sleep(duration)
    tokens1, requests1, cpu1, wall1 = counts[0], counts[1], cpu_seconds(server_pid), time.monotonic()
    client_cpu = time.process_time() - client_cpu0
    for transport in transports:
        transport.close()
    elapsed = wall1 - wall0
    return {"tokens_per_s": (tokens1 - tokens0) / elapsed,
            "requests_per_s": (requests1 - requests0) / elapsed,
            "server_cores": (cpu1 - cpu0) / elapsed, "client_cores": client_cpu / elapsed,
            "tokens": tokens1 - tokens0, "dropped_connections": counts[2]}


def wait_healthy(urls: list[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench: {url} did not come up") from None
                time.sleep(0.1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=TARGET_STREAMS)
    parser.add_argument("--instances", type=int, default=8)
    parser.add_argument("--step-ms", type=float, default=40.0)
    parser.add_argument("--output-tokens", type=int, default=200)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--server-cpu", type=int, default=None, help="pin the server process to this CPU")
    parser.add_argument("--client-cpu", type=int, default=None, help="pin this (client) process to this CPU")
    args = parser.parse_args()
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    server_cpu = args.server_cpu
    spec = bench_spec(args.instances, args.step_ms)
    urls = [i["url"] for i in spec["topologies"][0]["instances"]]  # type: ignore[index]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(spec, handle)
    server = subprocess.Popen([sys.executable, "-m", "crossover.sim.cli", handle.name],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                              preexec_fn=None if server_cpu is None else
                              lambda: os.sched_setaffinity(0, {server_cpu}))
    try:
        wait_healthy(urls)
        result = asyncio.run(drive(urls, args.streams, args.output_tokens, args.warmup, args.duration,
                                   server.pid))
        gaps = [json.loads(urllib.request.urlopen(u + "/admin/stats", timeout=10).read())["emission_gaps"]
                for u in urls]
    finally:
        server.terminate()
        server.communicate(timeout=30)
        os.unlink(handle.name)
    offered = args.streams * 1000 / args.step_ms
    per_core = result["tokens_per_s"] / max(result["server_cores"], 1e-9)
    p99 = max(g.get("p99_s", 0.0) for g in gaps)
    p50 = max(g.get("p50_s", 0.0) for g in gaps)
    worst = max(g.get("max_s", 0.0) for g in gaps)
    pinned = "" if server_cpu is None else f" on CPU {server_cpu}"
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; "
          f"server: 1 process{pinned}, {args.instances} instances, "
          f"{args.step_ms:g} ms steps; client: 1 process, {args.streams} keep-alive streams")
    print(f"{'figure':<38}{'measured':>14}{'target':>12}{'ratio':>9}")
    rows = [
        ("concurrent streams", args.streams, TARGET_STREAMS, args.streams / TARGET_STREAMS),
        ("offered tokens/s (streams/step)", offered, None, None),
        ("streamed tokens/s (client count)", result["tokens_per_s"], None, result["tokens_per_s"] / offered),
        ("server CPU (cores busy)", result["server_cores"], None, None),
        ("client CPU (cores busy)", result["client_cores"], None, None),
        ("tokens/s per server core", per_core, TARGET_TOKENS_PER_CORE, per_core / TARGET_TOKENS_PER_CORE),
        ("emission gap p50 (ms)", p50 * 1000, None, None),
        ("emission gap p99 (ms, worst instance)", p99 * 1000, TARGET_GAP_P99_S * 1000,
         TARGET_GAP_P99_S / p99 if p99 > 0 else float("inf")),
        ("emission gap max (ms)", worst * 1000, None, None),
    ]
    for name, value, target, ratio in rows:
        print(f"{name:<38}{value:>14,.1f}{'' if target is None else f'{target:,.0f}':>12}"
              f"{'' if ratio is None else f'{ratio:.2f}x':>9}")
    print(f"completed requests/s {result['requests_per_s']:.1f}; dropped connections "
          f"{result['dropped_connections']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
