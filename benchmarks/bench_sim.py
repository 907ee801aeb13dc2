"""Simulator throughput benchmark: concurrent streams, streamed tokens/s per server core, and the gap
between each token's scheduled emission (its step's modelled end) and the moment it was written.

    python benchmarks/bench_sim.py [--streams 2000] [--instances 8,16] [--step-ms 40] [--duration 20]
                                   [--emitters thread,thread-normal,loop] [--loops uvloop,asyncio]
                                   [--gc auto,freeze,20000] [--client-loop auto] [--report-every 10]
                                   [--smoke]

One `crossover sim` server process (N colocated instances of a synthetic spec whose steps take a fixed
time) and one client process (this one: asyncio protocols, closed loop, keep-alive, counting SSE
chunks). `--emitters` (who writes the tokens: the emitter thread or the event loop), `--loops`, `--gc`
(the server's collector policy) and `--instances` (the same streams spread over that many instances:
the burst of writes per step shrinks) each add columns, side by side.
`--report-every S` prints each S seconds of the window as it ends (gap percentiles, collector pauses,
server RSS), for long runs: the gap ring holds the last 65,536 tokens of an instance, so S must stay
under ~10 s at 250 streams per instance; the column's percentiles are then the worst interval's.
Server CPU comes from /proc, so tokens per server CPU-second is measured, not assumed.
Targets (issue 3): >= 2,000 concurrent streams, >= 50,000 streamed tokens/s per core, p99 gap <= 2 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path
from typing import cast

import yaml
from figures import add_smoke_flag, print_figures

from crossover.eventloop import LOOPS, loop_factory
from crossover.processes import cpu_seconds

TARGET_STREAMS = 2000
TARGET_TOKENS_PER_CORE = 50_000
TARGET_GAP_P99_S = 0.002
SETTLE_S = 1.0  # after opening every connection, before the first request
RAMP_S = 3.0  # the streams after each instance's first start over this long
# The emitter thread's counters in /admin/stats (summed over --report-every intervals), and its maxima.
EMITTER_COUNTS = ("late_submissions", "late_behind", "late_alone", "late_send")
EMITTER_FIGURES = (*EMITTER_COUNTS, "late_submission_max_ms", "first_write_late_max_ms")


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


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Stream(asyncio.Protocol):
    """One keep-alive connection sending the next streamed completion when the last one ends."""

    def __init__(self, request: bytes, counts: list[int]) -> None:
        self.request = request
        self.counts = counts  # [tokens, requests, connections lost]
        self.tail = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses

    def start(self) -> None:
        assert self.transport is not None
        self.transport.write(self.request)

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


async def read_stats(urls: list[str], reset: bool) -> list[dict[str, object]]:
    loop = asyncio.get_running_loop()
    query = "?reset=1" if reset else ""
    return [json.loads(await loop.run_in_executor(None, fetch, url + "/admin/stats" + query)) for url in urls]


def gap_figures(stats: list[dict[str, object]]) -> dict[str, float]:
    """The worst instance's gap percentiles, and the collector's pauses (process-wide, from the first
    instance's reply: a reset by the first read empties it for the others)."""
    gaps = [cast(dict[str, float], s["emission_gaps"]) for s in stats]
    gc_stats = cast(dict[str, list[float]], stats[0]["gc"]) if "gc" in stats[0] else {}
    out = {"gap_p50_ms": 1000 * max(g.get("p50_s", 0.0) for g in gaps),
           "gap_p99_ms": 1000 * max(g.get("p99_s", 0.0) for g in gaps),
           "gap_max_ms": 1000 * max(g.get("max_s", 0.0) for g in gaps)}
    emitter = cast(dict[str, float], stats[0].get("emitter", {}))
    if emitter:
        out["priority"] = cast(float, emitter["priority"])  # a word: what the thread was granted
        out["late_submissions"] = emitter["late_submissions"]
        out["late_submission_max_ms"] = 1000 * emitter["late_submission_max_s"]
        out["first_write_late_max_ms"] = 1000 * emitter["first_write_late_max_s"]
        out["late_behind"] = emitter["late_behind_previous"]
        out["late_alone"] = emitter["late_on_its_own"]
        out["late_send"] = emitter["late_in_first_send"]
    if gc_stats:
        for generation in range(3):
            out[f"gc{generation}_n"] = gc_stats["collections"][generation]
            out[f"gc{generation}_max_ms"] = 1000 * gc_stats["max_s"][generation]
            out[f"gc{generation}_ms"] = 1000 * gc_stats["seconds"][generation]
    return out


async def open_streams(urls: list[str], streams: int, output_tokens: int,
                       counts: list[int]) -> list[list[Stream]]:
    """One keep-alive connection per stream, its request ready; grouped by instance."""
    loop = asyncio.get_running_loop()
    rng = random.Random(0)
    groups: list[list[Stream]] = [[] for _ in urls]
    for index in range(streams):
        # Lengths spread +-50% around the mean, so streams do not all end (and restart) in one step.
        max_tokens = rng.randint(output_tokens // 2, output_tokens * 3 // 2)
        body = json.dumps({"model": "bench", "prompt": "a b c d", "max_tokens": max_tokens,
                           "ignore_eos": True, "stream": True}).encode()
        host, port = urls[index % len(urls)].rsplit("/", 1)[-1].split(":")
        request = (f"POST /v1/completions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json"
                   f"\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
        transport, stream = await loop.create_connection(partial(Stream, request, counts), host, int(port))
        stream.transport = cast(asyncio.Transport, transport)  # uvloop calls connection_made a turn later
        groups[index % len(urls)].append(stream)
    return groups


async def start_streams(groups: list[list[Stream]], step_s: float) -> None:
    """Each instance's step clock starts with its first request and keeps its cadence while busy:
    start one stream per instance a fraction of a step apart, as independent replicas would be,
    then the rest, so the instances' steps are not phase-locked (which would pile every step's
    writes onto the same moment). The rest start over RAMP_S: 2,000 requests at once hold the
    server's loop for ~0.3 s, past the engine's catch-up limit, and every instance would restart
    its step chain at the same moment (phase-locked) after it."""
    await asyncio.sleep(SETTLE_S)  # the server accepts the connections first, so that the first
    first = time.monotonic()        # requests below reach it when they are sent, not in a bunch
    for index, group in enumerate(groups):  # on an absolute grid: one late wake-up does not shift the rest
        await asyncio.sleep(max(0.0, first + index * step_s / len(groups) - time.monotonic()))
        group[0].start()
    await asyncio.sleep(step_s / len(groups))
    rest = [stream for index in range(1, max(map(len, groups))) for group in groups if index < len(group)
            for stream in (group[index],)]
    batches = max(1, int(RAMP_S / 0.01))
    for batch in range(batches):
        for stream in rest[batch * len(rest) // batches:(batch + 1) * len(rest) // batches]:
            stream.start()
        await asyncio.sleep(RAMP_S / batches)


def print_interval(label: str, elapsed: float, figures: dict[str, float]) -> None:
    print(f"{label}: {elapsed:6.0f} {figures['gap_p50_ms']:6.2f} "
          f"{figures['gap_p99_ms']:6.2f} {figures['gap_max_ms']:7.1f}   "
          + "  ".join(f"{figures.get(f'gc{g}_n', 0):.0f} ({figures.get(f'gc{g}_max_ms', 0):.1f})"
                      for g in range(3))
          + f"   {figures['rss_mib']:.0f}   {os.getloadavg()[0]:.2f}"
          + (f"   late submissions {figures['late_submissions']:.0f} (max "
             f"{figures['late_submission_max_ms']:.1f} ms), thread's first write late by <= "
             f"{figures['first_write_late_max_ms']:.2f} ms (> 1 ms: "
             f"{figures['late_behind']:.0f} behind the previous burst, "
             f"{figures['late_alone']:.0f} woken late, {figures['late_send']:.0f} in a slow "
             "first send)"
             if "late_submissions" in figures else ""),
          flush=True)


async def report_intervals(urls: list[str], server_pid: int, duration: float, report_every: float,
                           label: str, wall0: float) -> dict[str, float]:
    """Read (and reset) the server's figures every report_every seconds, printing each interval; the
    window's figures are the worst interval's, its counts the sum."""
    intervals: list[dict[str, float]] = []
    rss0 = rss_mib(server_pid)
    print(f"{label}: interval end (s), gap p50 / p99 / max (ms, worst instance), collections gen0 gen1 "
          f"gen2 (longest, ms), server RSS (MiB; {rss0:.0f} at the start), load average", flush=True)
    while time.monotonic() - wall0 < duration - 1e-3:
        await asyncio.sleep(max(0.0, min(report_every * (len(intervals) + 1), duration)
                                - (time.monotonic() - wall0)))
        figures = gap_figures(await read_stats(urls, reset=True))
        figures["rss_mib"] = rss_mib(server_pid)
        intervals.append(figures)
        print_interval(label, time.monotonic() - wall0, figures)
    window = {key: max(i[key] for i in intervals) for key in intervals[0]}
    for key in (*(f"gc{g}_{what}" for g in range(3) for what in ("n", "ms")), *EMITTER_COUNTS):
        if key in window:
            window[key] = sum(i[key] for i in intervals)
    window["rss_growth_mib"] = intervals[-1]["rss_mib"] - rss0
    window["gap_p99_median_ms"] = sorted(i["gap_p99_ms"] for i in intervals)[len(intervals) // 2]
    return window


async def drive(urls: list[str], streams: int, output_tokens: int, warmup: float, duration: float,
                server_pid: int, step_s: float = 0.04, report_every: float = 0.0,
                label: str = "") -> dict[str, float]:
    loop = asyncio.get_running_loop()
    counts = [0, 0, 0]
    groups = await open_streams(urls, streams, output_tokens, counts)
    await start_streams(groups, step_s)
    await asyncio.sleep(warmup)
    for url in urls:  # the measurement window starts now for the server's emission-gap ring too
        await loop.run_in_executor(None, fetch, url + "/admin/stats?reset=1")
    tokens0, requests0, cpu0, wall0 = counts[0], counts[1], cpu_seconds(server_pid), time.monotonic()
    client_cpu0 = time.process_time()
    if report_every > 0:
        window = await report_intervals(urls, server_pid, duration, report_every, label, wall0)
    else:
        await asyncio.sleep(duration)
    tokens1, requests1, cpu1, wall1 = counts[0], counts[1], cpu_seconds(server_pid), time.monotonic()
    client_cpu = time.process_time() - client_cpu0
    # The window's gaps, read while the streams still run: closing 2,000 connections at once stalls
    # the server's loop, and the tokens it emits meanwhile must not count.
    if report_every <= 0:
        window = gap_figures(await read_stats(urls, reset=False))
    for group in groups:
        for stream in group:
            if stream.transport is not None:
                stream.transport.close()
    elapsed = wall1 - wall0
    return {"tokens_per_s": (tokens1 - tokens0) / elapsed,
            "requests_per_s": (requests1 - requests0) / elapsed,
            "server_cores": (sum(cpu1) - sum(cpu0)) / elapsed, "client_cores": client_cpu / elapsed,
            "server_kernel_share": (cpu1[1] - cpu0[1]) / max(sum(cpu1) - sum(cpu0), 1e-9),
            "tokens": tokens1 - tokens0, "dropped_connections": counts[2], **window}


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def wait_healthy(urls: list[str], server: subprocess.Popen[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    for url in urls:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise SystemExit(f"bench: the server exited: {server.communicate()[1].strip()}") from None
                if time.monotonic() > deadline:
                    raise SystemExit(f"bench: {url} did not come up") from None
                time.sleep(0.1)


def raise_priority(nice: int) -> None:
    """Run this process and the servers it starts ahead of the machine's other work, so that the
    simulator is measured, not the neighbours' time slices. With autogroup scheduling (most desktop
    and VM kernels) a nice value only ranks processes within their session, so this process starts
    a session of its own and sets that session's group priority too (both need root to go negative)."""
    with contextlib.suppress(OSError):
        os.setsid()  # fails when this process already leads a process group: its own session then
    autogroup = Path("/proc/self/autogroup")
    if autogroup.exists():
        autogroup.write_text(str(nice))
    os.nice(nice)


def place_server(cpu: int | None) -> None:
    """In the server's child process before exec: pin it (its nice value is inherited from here)."""
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def run_level(args: argparse.Namespace, streams: int, loop: str, gc_policy: str,
              instances: int, emitter: str) -> dict[str, float]:
    """One fresh server on event loop `loop`, `streams` closed-loop streams: the figures of one column."""
    spec = bench_spec(instances, args.step_ms)
    urls = [i["url"] for i in spec["topologies"][0]["instances"]]  # type: ignore[index]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(spec, handle)
    server_cpu = args.server_cpu
    command = [sys.executable, "-m", "crossover.sim.cli", handle.name]
    env, cwd = None, None
    if loop == "base":  # an older checkout's simulator, from the package tree in --base
        cwd = os.path.abspath(args.base)
        env = {**os.environ, "PYTHONPATH": cwd}
    else:
        writer, _, priority = emitter.partition("-")
        command += ["--loop", loop, "--gc", gc_policy, "--emitter", writer,
                    "--emitter-priority", priority or "realtime"]
    server = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True,
                              preexec_fn=partial(place_server, server_cpu))
    try:
        wait_healthy(urls, server)
        with asyncio.Runner(loop_factory=loop_factory(args.client_loop)) as runner:
            result = runner.run(drive(urls, streams, args.output_tokens, args.warmup, args.duration,
                                      server.pid, args.step_ms / 1000, args.report_every,
                                      f"{streams}/{instances} {emitter} {loop} gc {gc_policy}"))
        result["loadavg"] = os.getloadavg()[0]
    finally:
        server.terminate()
        server.communicate(timeout=30)
        os.unlink(handle.name)
    result["offered"] = streams * 1000 / args.step_ms
    result["per_core"] = result["tokens_per_s"] / max(result["server_cores"], 1e-9)
    return result


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", default=f"500,1000,{TARGET_STREAMS}",
                        help="comma-separated stream counts, one fresh server each (columns)")
    parser.add_argument("--instances", default="8",
                        help="comma-separated instance counts of the server (the streams spread over them)")
    parser.add_argument("--step-ms", type=float, default=40.0)
    parser.add_argument("--output-tokens", type=int, default=200)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--duration", type=float, default=12.0)
    parser.add_argument("--server-cpu", type=int, default=None, help="pin the server process to this CPU")
    parser.add_argument("--nice", type=int, default=None, metavar="N",
                        help="add N to the server's and the client's nice value and to their session's "
                        "(autogroup's), e.g. -10, as root: ahead of the machine's other work")
    parser.add_argument("--client-cpu", type=int, default=None, help="pin this (client) process to this CPU")
    parser.add_argument("--emitters", default="thread",
                        help="comma-separated writers of the streamed tokens, a column each: thread "
                        "(crossover sim --emitter thread, realtime priority where allowed), thread-normal "
                        "(--emitter-priority normal), loop")
    parser.add_argument("--loops", default="auto",
                        help=f"comma-separated server event loops ({', '.join(LOOPS)}), "
                        "a column each per stream count")
    parser.add_argument("--gc", default="auto",
                        help="comma-separated collector policies of the server (crossover sim --gc: a "
                             "young-generation threshold, freeze or auto), a column each")
    parser.add_argument("--report-every", type=float, default=0.0, metavar="S",
                        help="print the window's figures every S seconds as it runs (long runs)")
    parser.add_argument("--client-loop", choices=LOOPS, default="auto", help="the client's event loop")
    parser.add_argument("--base", default=None, metavar="DIR",
                        help="also run, as loop `base`, the simulator of an older checkout: DIR holds its "
                        "`crossover` package tree (crossover/ with sim/ inside), first on the server's path")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run each stream count's columns N times, interleaved (A B A B ...), so that "
                        "what the machine's other work does falls on every column alike")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # one column: 200 streams on 2 instances, 1 s warm-up, 2 s measured
        args.streams, args.instances, args.warmup, args.duration = "200", "2", 1.0, 2.0
    return args


Column = tuple[int, str, str, int, str]  # streams, server loop, collector policy, instances, emitter


def plan_columns(args: argparse.Namespace) -> tuple[list[Column], list[int]]:
    """Every combination of the comma-separated options, a column each, and each column's round."""
    columns: list[Column] = [(int(n), loop, policy, int(k), emitter) for n in args.streams.split(",")
                             for k in args.instances.split(",") for emitter in args.emitters.split(",")
                             for loop in args.loops.split(",") for policy in args.gc.split(",")]
    if args.base is not None:
        columns += [(n, "base", "-", k, "-") for n, k in dict.fromkeys((n, k) for n, _, _, k, _ in columns)]
        columns.sort(key=lambda column: column[0])
    rounds = [1] * len(columns)
    if args.repeat > 1:
        counts = list(dict.fromkeys(column[0] for column in columns))
        order = [(c, r) for n in counts for r in range(1, args.repeat + 1) for c in columns if c[0] == n]
        columns, rounds = [c for c, _ in order], [r for _, r in order]
    for _, loop, _, _, emitter in columns:
        if emitter not in ("thread", "thread-normal", "loop", "-"):
            raise SystemExit(f"bench: --emitters: unknown writer {emitter!r} (thread, thread-normal, loop)")
        if loop != "base":
            loop_factory(loop)  # an unknown name or a missing uvloop fails here, before any server starts
    return columns, rounds


def print_machine(args: argparse.Namespace) -> None:
    pinned = "" if args.server_cpu is None else f" pinned to CPU {args.server_cpu}"
    if args.nice is not None:
        pinned += f", nice {args.nice:+d} (the client too)"
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; server: one "
          f"process{pinned}, {args.instances} instances, tokens written by {args.emitters}, "
          f"{args.step_ms:g} ms steps, {args.output_tokens} tokens per request; client: one process "
          f"({args.client_loop} loop), keep-alive streams, "
          "closed loop")
    print(f"targets: >= {TARGET_STREAMS} streams, >= {TARGET_TOKENS_PER_CORE:,} tokens/s per server core, "
          f"emission gap p99 <= {TARGET_GAP_P99_S * 1000:g} ms")


# The table's rows: (label, result key, format).
ROWS: tuple[tuple[str, str, str], ...] = (
    ("concurrent streams", "streams", "{:,.0f}"),
    ("offered tokens/s (streams / step)", "offered", "{:,.0f}"),
    ("streamed tokens/s (client count)", "tokens_per_s", "{:,.0f}"),
    ("server CPU (cores busy)", "server_cores", "{:.2f}"),
    ("  of which in the kernel (socket writes)", "server_kernel_share", "{:.0%}"),
    ("client CPU (cores busy)", "client_cores", "{:.2f}"),
    ("tokens/s per server core", "per_core", "{:,.0f}"),
    ("  ratio to the 50,000 target", "per_core_ratio", "{:.2f}x"),
    ("emission gap p50 (ms)", "gap_p50_ms", "{:.2f}"),
    ("emission gap p99 (ms, worst instance)", "gap_p99_ms", "{:.2f}"),
    ("  ratio to the 2 ms target", "gap_ratio", "{:.2f}x"),
    ("  median interval's p99 (--report-every)", "gap_p99_median_ms", "{:.2f}"),
    ("emission gap max (ms)", "gap_max_ms", "{:.1f}"),
    ("emitter thread's priority (granted)", "priority", "{}"),
    ("  steps handed over after their burst's start", "late_submissions", "{:.0f}"),
    ("  latest hand-over (ms after its burst)", "late_submission_max_ms", "{:.1f}"),
    ("  thread's first write late by, max (ms)", "first_write_late_max_ms", "{:.2f}"),
    ("  > 1 ms late: behind the previous burst", "late_behind", "{:.0f}"),
    ("  > 1 ms late: thread woken late (no core)", "late_alone", "{:.0f}"),
    ("  > 1 ms late: in its first send (kernel)", "late_send", "{:.0f}"),
    ("collections gen0 / gen1 / gen2", "gc_n", "{}"),
    ("  longest pause gen0 / gen1 / gen2 (ms)", "gc_max", "{}"),
    ("  collector time, share of the window", "gc_share", "{:.1%}"),
    ("server RSS growth over the window (MiB)", "rss_growth_mib", "{:+.0f}"),
    ("dropped connections", "dropped_connections", "{:.0f}"),
    ("load average (1 min, column's end)", "loadavg", "{:.2f}"),
)


def complete_figures(args: argparse.Namespace, columns: list[Column],
                     results: list[dict[str, float]]) -> None:
    """The derived figures of each column, and placeholders where a server does not report one."""
    for (level, _, _, _, _), result in zip(columns, results, strict=True):
        result["streams"] = level
        recorded = "gc0_n" in result  # an older simulator (--base) does not report its collector
        result["gc_n"] = " / ".join(f"{result[f'gc{g}_n']:.0f}" for g in range(3)) \
            if recorded else "n/a"  # type: ignore[assignment]
        result["gc_max"] = " / ".join(f"{result[f'gc{g}_max_ms']:.1f}" for g in range(3)) \
            if recorded else "n/a"  # type: ignore[assignment]
        result["gc_share"] = sum(result[f"gc{g}_ms"] for g in range(3)) / 1000 / args.duration \
            if recorded else float("nan")
        result.setdefault("rss_growth_mib", float("nan"))
        for key in EMITTER_FIGURES:
            result.setdefault(key, float("nan"))  # the loop writes: no emitter thread
        result.setdefault("priority", "-")  # type: ignore[arg-type]
        result.setdefault("gap_p99_median_ms", float("nan"))
        result["per_core_ratio"] = result["per_core"] / TARGET_TOKENS_PER_CORE
        result["gap_ratio"] = result["gap_p99_ms"] / (TARGET_GAP_P99_S * 1000)


def print_table(args: argparse.Namespace, columns: list[Column], rounds: list[int],
                results: list[dict[str, float]]) -> None:
    varied = [len({column[i] for column in columns}) > 1 for i in range(5)]
    heads = [" ".join([f"{n}"] + [f"{k}i"] * varied[3] + [emitter] * varied[4] + [loop] * varied[1]
                      + [f"gc {policy}"] * varied[2] + [f"#{r}"] * (args.repeat > 1))
             if any(varied[1:]) or args.repeat > 1 else f"{n} streams"
             for (n, loop, policy, k, emitter), r in zip(columns, rounds, strict=True)]
    cells = [[fmt.format(r[key]) for r in results] for _, key, fmt in ROWS]
    width = max(16, *(len(cell) + 2 for cell in [*heads, *(c for row in cells for c in row)]))
    print(f"{'figure':<40}" + "".join(f"{head:>{width}}" for head in heads))
    for (label, _, _), row in zip(ROWS, cells, strict=True):
        print(f"{label:<40}" + "".join(f"{cell:>{width}}" for cell in row))


def main() -> int:
    args = parse_args()
    columns, rounds = plan_columns(args)
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    if args.nice is not None:
        raise_priority(args.nice)
    results = [run_level(args, *column) for column in columns]
    print_machine(args)
    complete_figures(args, columns, results)
    print_table(args, columns, rounds, results)
    print_figures({"columns": [{"column": f"{n}/{k} {emitter} {loop} gc {policy} #{r}", **result}
                               for (n, loop, policy, k, emitter), r, result in zip(columns, rounds, results,
                                                                                   strict=True)]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
