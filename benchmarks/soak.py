"""Soak: the exporter (`crossover exporter`, a real subprocess) scraping 500 targets for minutes
while faults are switched on and off, to check that its memory (RSS) and CPU per cycle stay flat.

The targets are served by benchmarks/soak_farm.py (one light aiohttp process on loopback, one
path per target, real vLLM 0.32.0 payloads whose counters grow). Every `--fault-period` seconds
the faults flip: off, then `--fault-fraction` of the targets down, answering 500, too slow,
malformed, truncated, restarted (counter reset) or renamed (legacy names), then off again, with a
different random choice of targets each time. A Prometheus-like reader fetches the exporter's
/metrics once per interval meanwhile, as Prometheus would.

Printed: one row per phase (side by side: clean and faulted phases of the same run) and the RSS
trend after the first phase (the windows fill during it). Not a test: figures go to
docs/performance.md, section "Soak".

The fleet is seed-70b-h100.yaml's model at its TP=4, loaded through the spec's own validation.

Run: .venv/bin/python benchmarks/soak.py [--duration 180] [--targets 500] [--interval 5] [--trace] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from figures import add_smoke_flag, print_figures

from crossover.netutil import free_port
from crossover.processes import cpu_seconds
from crossover.spec import load_spec, parse_spec

REPO = Path(__file__).resolve().parent.parent
WINDOW_S = 60.0


@dataclass
class Sample:
    at: float  # seconds since the soak started
    phase: int
    rss_mb: float
    cpu_s: float  # exporter process CPU (user + system) since it started
    scrapes: float  # sum of crossover_scrapes_total over the targets
    cycle_s: float  # crossover_exporter_cycle_seconds, the last cycle's wall time
    up: int  # targets with crossover_target_up 1
    metrics_bytes: int
    errors: dict[str, float]  # crossover_scrape_errors_total summed over targets, by reason


def proc_stats(pid: int) -> tuple[float, float]:
    """(RSS in MB, CPU seconds) of a process, from /proc."""
    cpu = sum(cpu_seconds(pid))
    with open(f"/proc/{pid}/status") as status:
        rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
    return rss, cpu


def http(url: str, body: dict[str, object] | None = None, timeout: float = 30) -> bytes:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return bytes(response.read())


def wait_ready(url: str, process: subprocess.Popen[bytes], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if process.poll() is not None:
            sys.exit(f"soak: {what} exited with {process.returncode}")
        try:
            http(url, timeout=2)
            return
        except OSError:
            if time.monotonic() > deadline:
                sys.exit(f"soak: {what} not ready within {timeout:g} s")
            time.sleep(0.5)


def soak_spec(farm_url: str, targets: int, topologies: int, interval: float,
              timeout: float) -> dict[str, object]:
    """seed-70b-h100.yaml's model and hardware with `targets` instances in `topologies` topologies, at
    the seed's first topology's TP (4, which fits an H100), validated as `crossover validate` would."""
    seed = REPO / "compose" / "specs" / "seed-70b-h100.yaml"
    data = load_spec(seed).model_dump(mode="json")
    tp = data["topologies"][0]["tensor_parallel_size"]
    per = [targets // topologies + (1 if t < targets % topologies else 0) for t in range(topologies)]
    data["topologies"] = []
    index = 0
    for t, count in enumerate(per):
        instances = []
        for _ in range(count):
            instances.append({"name": f"t{index}", "url": f"{farm_url}/t{index}"})
            index += 1
        data["topologies"].append({"name": f"topo{t}", "gpus": tp * count, "tensor_parallel_size": tp,
                                   "instances": instances, "entrypoint": {"balance": "round_robin"}})
    data["scrape"] = {"interval": f"{interval:g}s", "timeout": f"{timeout:g}s", "windows": [f"{WINDOW_S:g}s"]}
    data["simulator"]["faults"] = {}
    parse_spec(data, f"soak's fleet ({seed.name}, {targets} targets)")  # here, not in the exporter's log
    return data


def read_metrics(url: str) -> tuple[float, float, int, int, dict[str, float]]:
    """(sum of scrapes_total, last cycle seconds, targets up, body bytes, errors by reason) from the
    exporter's /metrics, read by plain line scanning: the body is megabytes and a full parser here
    would cost the machine more CPU than the exporter itself."""
    body = http(url + "/metrics")
    scrapes = cycle = 0.0
    up = 0
    errors: dict[str, float] = {}
    for line in body.decode().split("\n"):
        if not line.startswith(("crossover_scrape", "crossover_target_up", "crossover_exporter_cycle")):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith("crossover_scrapes_total"):
            scrapes += float(value)
        elif name.startswith("crossover_exporter_cycle_seconds"):
            cycle = float(value)
        elif name.startswith("crossover_target_up"):
            up += int(float(value))
        elif name.startswith("crossover_scrape_errors_total"):
            reason = name.split('reason="', 1)[1].split('"', 1)[0]
            errors[reason] = errors.get(reason, 0.0) + float(value)
    return scrapes, cycle, up, len(body), errors


def slope_mb_per_min(samples: list[Sample]) -> float:
    if len(samples) < 3:
        return float("nan")
    xs = [s.at / 60 for s in samples]
    ys = [s.rss_mb for s in samples]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def phase_rows(samples: list[Sample], targets: int, period: float, settle: float) -> list[dict[str, Any]]:
    """One row per phase, from the samples taken `settle` seconds or more into it (so that a cycle
    begun in the previous phase is not counted in this one)."""
    rows = []
    for phase in sorted({s.phase for s in samples}):
        chosen = [s for s in samples if s.phase == phase and s.at >= phase * period + settle]
        if len(chosen) < 2:
            continue
        first, last = chosen[0], chosen[-1]
        cycles = (last.scrapes - first.scrapes) / targets
        cpu = last.cpu_s - first.cpu_s
        rows.append({
            "phase": phase, "faults": "on" if phase % 2 else "off", "seconds": round(last.at - first.at),
            "cycles": round(cycles, 1), "cpu_per_cycle_s": cpu / cycles if cycles else float("nan"),
            "cycle_wall_mean_s": statistics.fmean(s.cycle_s for s in chosen),
            "cycle_wall_max_s": max(s.cycle_s for s in chosen),
            "rss_start_mb": first.rss_mb, "rss_end_mb": last.rss_mb,
            "rss_max_mb": max(s.rss_mb for s in chosen), "targets_up_min": min(s.up for s in chosen),
            "errors": " ".join(f"{k}={v - first.errors.get(k, 0):.0f}" for k, v in sorted(last.errors.items())
                               if v - first.errors.get(k, 0) > 0) or "-",
        })
    return rows


def time_rows(samples: list[Sample], targets: int, bucket_s: float) -> list[dict[str, Any]]:
    """One row per `bucket_s` of the run, the whole run over time: does CPU per cycle or RSS drift?
    Phases are mixed within a bucket, so this shows the drift; phase_rows shows faults on vs off."""
    rows = []
    for start in range(0, int(samples[-1].at) + 1, int(bucket_s)):
        chosen = [s for s in samples if start <= s.at < start + bucket_s]
        if len(chosen) < 2:
            continue
        first, last = chosen[0], chosen[-1]
        cycles = (last.scrapes - first.scrapes) / targets
        rows.append({"from_s": start, "cycles": cycles,
                     "cpu_per_cycle_s": (last.cpu_s - first.cpu_s) / cycles if cycles else float("nan"),
                     "rss_mean_mb": statistics.fmean(s.rss_mb for s in chosen),
                     "rss_max_mb": max(s.rss_mb for s in chosen),
                     "up_min": min(s.up for s in chosen)})
    return rows


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="exporter soak: 500 targets, faults on and off")
    parser.add_argument("--duration", type=float, default=180.0, help="seconds (default 180)")
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--topologies", type=int, default=5)
    parser.add_argument("--interval", type=float, default=5.0, help="scrape interval, seconds")
    parser.add_argument("--timeout", type=float, default=2.0, help="scrape timeout, seconds")
    parser.add_argument("--fault-period", type=float, default=30.0, help="seconds per phase")
    parser.add_argument("--fault-fraction", type=float, default=0.2, help="share of targets faulted")
    parser.add_argument("--trace", action="store_true",
                        help="run the exporter under benchmarks/soak_probe.py (tracemalloc): traced "
                             "Python heap vs RSS over time, and the lines that grew (costs exporter CPU)")
    parser.add_argument("--bucket", type=float, default=60.0,
                        help="seconds per row of the over-time table (default 60)")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # 20 targets, three 6-s phases (off, on, off), traced: the farm and the probe run too
        args.duration, args.targets, args.topologies, args.interval, args.timeout = 18.0, 20, 2, 1.0, 0.5
        args.fault_period, args.bucket, args.trace = 6.0, 6.0, True
    return args


@dataclass
class SoakRun:
    """What one soak measured, for the report."""

    samples: list[Sample]
    probes: list[dict[str, Any]]
    tracebacks: int
    farm_cpu_s: float
    load_start: str
    load_end: str


def sample_exporter(args: argparse.Namespace, farm_url: str, exporter: subprocess.Popen[bytes],
                    exporter_url: str) -> list[Sample]:
    """Flip the farm's faults every fault period and read the exporter twice an interval."""
    samples: list[Sample] = []
    started = time.monotonic()
    phase = -1
    while (now := time.monotonic() - started) < args.duration:
        current = int(now // args.fault_period)
        if current != phase:
            phase = current
            fraction = args.fault_fraction if phase % 2 else 0.0
            kinds = json.loads(http(farm_url + "/admin/faults", {"fraction": fraction, "seed": phase}))
            state = "on " + json.dumps(kinds) if kinds else "off"
            print(f"  {now:6.1f} s phase {phase}: faults {state}", flush=True)
        scrapes, cycle, up, size, errors_now = read_metrics(exporter_url)
        rss, cpu = proc_stats(exporter.pid)
        samples.append(Sample(now, phase, rss, cpu, scrapes, cycle, up, size, errors_now))
        time.sleep(max(0.0, args.interval / 2 - (time.monotonic() - started - now)))
    if exporter.poll() is not None:
        sys.exit(f"soak: the exporter died ({exporter.returncode})")
    return samples


def run_soak(args: argparse.Namespace) -> SoakRun:
    """Start the target farm and the exporter, sample them for the duration, stop both."""
    with tempfile.TemporaryDirectory(prefix="crossover-soak-") as folder:
        farm_port, exporter_port = free_port(), free_port()
        farm_url, exporter_url = f"http://127.0.0.1:{farm_port}", f"http://127.0.0.1:{exporter_port}"
        spec_path = Path(folder) / "soak.yaml"
        spec_path.write_text(yaml.safe_dump(soak_spec(farm_url, args.targets, args.topologies, args.interval,
                                                      args.timeout), sort_keys=False))
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        log = (Path(folder) / "exporter.log").open("wb")
        farm = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "soak_farm.py"), "--port",
                                 str(farm_port), "--targets", str(args.targets),
                                 "--slow", str(args.timeout * 5)], env=env, stdin=subprocess.DEVNULL)
        exporter = None
        probe = Path(folder) / "probe.jsonl"
        try:
            wait_ready(farm_url + "/health", farm, "the target farm")
            launcher = ([str(REPO / "benchmarks" / "soak_probe.py"), str(probe), "--every",
                         str(args.bucket / 2), "--"] if args.trace else ["-m", "crossover"])
            exporter = subprocess.Popen([sys.executable, *launcher, "exporter", str(spec_path),
                                         "--port", str(exporter_port), "--log-level", "warning"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            wait_ready(exporter_url + "/health", exporter, "the exporter")
            load_start = Path("/proc/loadavg").read_text().split()[0]
            print(f"soak: {args.targets} targets, interval {args.interval:g} s, timeout {args.timeout:g} s, "
                  f"{args.duration:g} s, faults flip every {args.fault_period:g} s on "
                  f"{args.fault_fraction:.0%} of the targets", flush=True)
            farm_cpu_start = proc_stats(farm.pid)[1]
            samples = sample_exporter(args, farm_url, exporter, exporter_url)
            farm_cpu = proc_stats(farm.pid)[1] - farm_cpu_start
            load_end = Path("/proc/loadavg").read_text().split()[0]
        finally:
            for process in (exporter, farm):
                if process is not None and process.poll() is None:
                    process.terminate()
                    process.wait(10)
            log.close()
        tracebacks = (Path(folder) / "exporter.log").read_text(errors="replace").count("Traceback")
        probes = ([json.loads(line) for line in probe.read_text().splitlines()]
                  if args.trace and probe.exists() else [])
    return SoakRun(samples, probes, tracebacks, farm_cpu, load_start, load_end)


def print_phases(rows: list[dict[str, Any]]) -> None:
    print("\nphase faults seconds cycles  CPU/cycle s  cycle wall mean/max s  RSS start/end/max MB  up(min)"
          "  scrape errors in the phase")
    for r in rows:
        print(f"{r['phase']:>5} {r['faults']:>6} {r['seconds']:>7} {r['cycles']:>6}"
              f"  {r['cpu_per_cycle_s']:>11.3f}"
              f"  {r['cycle_wall_mean_s']:>9.3f} / {r['cycle_wall_max_s']:<9.3f}"
              f"  {r['rss_start_mb']:>6.0f} / {r['rss_end_mb']:>4.0f} / {r['rss_max_mb']:<6.0f}"
              f"  {r['targets_up_min']:>6}  {r['errors']}")


def print_trends(args: argparse.Namespace, samples: list[Sample],
                 rows: list[dict[str, Any]]) -> dict[str, float]:
    """Print the over-time table and the trends; return their figures."""
    print(f"\nover time ({args.bucket:g} s rows)\n  from s  cycles  CPU/cycle s  RSS mean/max MB  up(min)")
    for t in time_rows(samples, args.targets, args.bucket):
        print(f"  {t['from_s']:>6} {t['cycles']:>7.1f}  {t['cpu_per_cycle_s']:>11.3f}"
              f"  {t['rss_mean_mb']:>8.0f} / {t['rss_max_mb']:<6.0f} {t['up_min']:>6}")
    # Histories fill during the first window (1m) plus a couple of cycles: the trend starts after.
    warmup = WINDOW_S + 2 * args.interval
    settled = [s for s in samples if s.at >= warmup] or samples
    clean_rows = [r for r in rows if r["faults"] == "off" and r["phase"] >= 1]
    faulted_rows = [r for r in rows if r["faults"] == "on"]
    clean = [r["cpu_per_cycle_s"] for r in clean_rows]
    faulted = [r["cpu_per_cycle_s"] for r in faulted_rows]
    print(f"\nRSS trend after the first {warmup:g} s: {slope_mb_per_min(settled):+.2f} MB/min "
          f"(min {min(s.rss_mb for s in settled):.0f}, max {max(s.rss_mb for s in settled):.0f} MB)")
    late = [s for s in samples if s.at >= samples[-1].at / 2]
    print(f"RSS trend over the second half: {slope_mb_per_min(late):+.2f} MB/min "
          f"(min {min(s.rss_mb for s in late):.0f}, max {max(s.rss_mb for s in late):.0f} MB)")
    if clean and faulted:
        print(f"CPU per cycle: clean phases {statistics.fmean(clean):.3f} s, faulted phases "
              f"{statistics.fmean(faulted):.3f} s")
    return {"rss_trend_mb_per_min": slope_mb_per_min(settled),
            "rss_trend_second_half_mb_per_min": slope_mb_per_min(late),
            "rss_max_mb": max(s.rss_mb for s in settled),
            "cpu_per_cycle_clean_s": statistics.fmean(clean) if clean else float("nan"),
            "cpu_per_cycle_faulted_s": statistics.fmean(faulted) if faulted else float("nan"),
            "targets_up_clean_min": min((r["targets_up_min"] for r in clean_rows), default=float("nan")),
            "targets_up_faulted_min": min((r["targets_up_min"] for r in faulted_rows), default=float("nan"))}


def print_probes(probes: list[dict[str, Any]]) -> None:
    print("\ntracemalloc in the exporter (Python heap traced vs RSS)")
    print("      at s  traced MB  RSS MB  objects")
    for row in probes:
        print(f"  {row['at']:>8.0f}  {row['traced_mb']:>9.1f}  {row['rss_mb']:>6.0f}"
              f"  {row['objects']:>7}")
    print("lines grown most since the baseline snapshot, at the end:")
    for line in probes[-1].get("grown", []):
        print(f"  {line}")


def main() -> int:
    args = parse_args()
    run = run_soak(args)
    rows = phase_rows(run.samples, args.targets, args.fault_period, args.interval + args.timeout + 1)
    print_phases(rows)
    figures = print_trends(args, run.samples, rows)
    if run.probes:
        print_probes(run.probes)
    print(f"/metrics body {run.samples[-1].metrics_bytes / 1024:.0f} KB; "
          f"target farm CPU {run.farm_cpu_s:.1f} s; tracebacks in the exporter log: {run.tracebacks}; "
          f"machine load average {run.load_start} at the start, {run.load_end} at the end "
          f"({os.cpu_count()} CPUs)")
    first, last = run.samples[0], run.samples[-1]
    figures.update({"cycles": (last.scrapes - first.scrapes) / args.targets, "targets": args.targets,
                    "metrics_kb": last.metrics_bytes / 1024, "tracebacks": run.tracebacks})
    if run.probes:
        figures["traced_mb_max"] = max(row["traced_mb"] for row in run.probes)
    print_figures(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
