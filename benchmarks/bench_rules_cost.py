"""What the generated recording rules and alerts cost Prometheus, and what the exporter costs, on a big
fleet, side by side in one run: two Prometheus servers and `crossover exporter` scrape the same fake
fleet (N loopback targets, each serving the real vLLM 0.32 payload captured in tests/fixtures, about
52 KB) every 5 s, one Prometheus with the rules `crossover rules` generates for that fleet and one
without. All three run at once, so the machine's noise hits each.

    python benchmarks/bench_rules_cost.py [--targets 1000] [--topologies 10] [--seconds 120] [--smoke]

Prints each process's CPU seconds per 5-s scrape cycle over the measured span; the rules' share (the
ruled server's minus the bare one's) and the exporter's, each against Prometheus scraping the same
fleet (the goal: at most 1x each); and `prometheus_rule_group_last_duration_seconds` of each rule
group with its interval.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path

import yaml
from figures import add_smoke_flag, print_figures
from prometheus_client.parser import text_string_to_metric_families

from crossover.netutil import free_port
from crossover.processes import cpu_seconds, stop_group
from crossover.rules.generate import Format, outputs
from crossover.rules.model import build_rules
from crossover.rules.prom import PrometheusServer, running_prometheus
from crossover.spec import FleetSpec, load_spec, parse_spec

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = REPO / "tests" / "fixtures" / "vllm-0.32.0-after-requests.prom"
SCRAPE = "5s"


def fleet_spec(targets: int, topologies: int, ports: list[int]) -> FleetSpec:
    """The seed spec's model and SLOs with `targets` instances in `topologies` topologies, validated as
    `crossover validate` would."""
    seed = REPO / "compose" / "specs" / "seed-70b-h100.yaml"
    data = load_spec(seed).model_dump(mode="json")
    per = targets // topologies
    data["topologies"] = [
        {"name": f"t{t}", "gpus": 4 * per, "tensor_parallel_size": 4,
         "instances": [{"name": f"t{t}-{i}", "url": f"http://127.0.0.1:{ports[t * per + i]}"}
                       for i in range(per)]}
        for t in range(topologies)]
    data["scrape"].update({"interval": SCRAPE, "timeout": SCRAPE})
    data["simulator"]["faults"] = {}
    return parse_spec(data, f"bench_rules_cost's fleet ({seed.name}, {targets} targets)")


async def _serve(count: int, body: bytes) -> None:
    """A minimal HTTP/1.1 server on `count` ports it binds itself (printed, one line): any request
    gets the payload (keep-alive)."""
    response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)) + body

    class Metrics(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport
            self.pending = b""

        def data_received(self, data: bytes) -> None:
            self.pending += data
            while b"\r\n\r\n" in self.pending:
                _, self.pending = self.pending.split(b"\r\n\r\n", 1)
                self.transport.write(response)  # type: ignore[attr-defined]

    loop = asyncio.get_running_loop()
    ports = []
    for _ in range(count):
        server = await loop.create_server(Metrics, "127.0.0.1", 0, backlog=64)
        ports.append(server.sockets[0].getsockname()[1])
    print(" ".join(map(str, ports)), flush=True)
    await asyncio.Event().wait()


def serve_forever(count: int) -> None:
    asyncio.run(_serve(count, PAYLOAD.read_bytes()))


def group_durations(server: PrometheusServer) -> dict[str, float]:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name == "prometheus_rule_group_last_duration_seconds":
            for sample in family.samples:
                out[sample.labels["rule_group"].rsplit(";", 1)[-1]] = sample.value
    return out


def start_exporter(spec: FleetSpec, folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`crossover exporter` on the fleet's spec, as a user runs it: (its process, its /metrics URL)."""
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "crossover", "exporter", str(path), "--port", str(port),
                                "--log-level", "warning"], start_new_session=True)
    return process, f"http://127.0.0.1:{port}/metrics"


def exporter_targets_up(url: str) -> float:
    """How many targets the exporter's last scrape reached (crossover_target_up), NaN when it does not
    answer."""
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            text = answer.read().decode()
    except OSError:
        return float("nan")
    return sum(sample.value for family in text_string_to_metric_families(text)
               if family.name == "crossover_target_up" for sample in family.samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--targets", type=int, default=1000)
    parser.add_argument("--topologies", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=120.0, help="measured span")
    parser.add_argument("--warmup", type=float, default=60.0, help="before measuring")
    parser.add_argument("--servers", type=int, default=4, help="processes serving the fake fleet")
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # 20 targets in 2 topologies from one process; 10 s of warm-up (all up), 10 s measured
        args.targets, args.topologies, args.servers, args.warmup, args.seconds = 20, 2, 1, 10.0, 10.0
    with ExitStack() as stack, tempfile.TemporaryDirectory(prefix="bench-rules-") as tmp:
        ports: list[int] = []
        for part in range(args.servers):  # the fake fleet's processes, each serving a share of the targets
            share = len(range(part, args.targets, args.servers))
            fleet = subprocess.Popen([sys.executable, __file__, "--serve", str(share)],
                                     stdout=subprocess.PIPE, text=True)
            stack.callback(fleet.wait, 10)
            stack.callback(fleet.terminate)
            assert fleet.stdout is not None
            ports += [int(p) for p in fleet.stdout.readline().split()]
        spec = fleet_spec(args.targets, args.topologies, ports)
        rules = build_rules(spec, source="bench")
        folder = Path(tmp)
        for name, text in outputs(spec, rules, Format.PLAIN, "bench", "bench").items():
            (folder / name).write_text(text)
        config = yaml.safe_load((folder / "prometheus.yml").read_text())
        config.pop("rule_files", None)
        config.pop("alerting", None)
        (folder / "scrape-only.yml").write_text(yaml.safe_dump(config))
        bare = stack.enter_context(running_prometheus(folder / "scrape-only.yml", start_timeout=120))
        ruled = stack.enter_context(running_prometheus(folder / "prometheus.yml", start_timeout=120))
        exporter, exporter_url = start_exporter(spec, folder)
        stack.callback(stop_group, exporter, 10.0)
        time.sleep(args.warmup)
        up = {s.url: s.query("count(up == 1)")[0].value for s in (bare, ruled)}
        up[exporter_url] = exporter_targets_up(exporter_url)
        pids = {bare.url: bare.process.pid, ruled.url: ruled.process.pid, exporter_url: exporter.pid}
        before = {url: sum(cpu_seconds(pid)) for url, pid in pids.items()}
        started = time.monotonic()
        time.sleep(args.seconds)
        span = time.monotonic() - started
        used = {url: sum(cpu_seconds(pid)) - before[url] for url, pid in pids.items()}
        durations = group_durations(ruled)
    cycles = span / 5.0
    scrape, both, exporting = (used[url] / cycles for url in (bare.url, ruled.url, exporter_url))
    records, alerts = len(rules.records), len(rules.alerts)
    print(f"{args.targets} targets x {PAYLOAD.stat().st_size / 1024:.0f} KB every {SCRAPE}, "
          f"{args.topologies} topologies; {records} recording rules, {alerts} alerts; measured {span:.0f} s "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"  targets up: scrape only {up[bare.url]:.0f}, scrape + rules {up[ruled.url]:.0f}, "
          f"exporter {up[exporter_url]:.0f}")
    print(f"  Prometheus CPU-s per 5-s cycle, scrape only     {scrape:6.2f}")
    print(f"  Prometheus CPU-s per 5-s cycle, scrape + rules  {both:6.2f}   ratio {both / scrape:.2f}x")
    print(f"  rules alone (difference)                        {both - scrape:6.2f}   "
          f"{(both - scrape) / scrape:.2f}x of scraping (goal <= 1x)")
    print(f"  crossover exporter CPU-s per 5-s cycle          {exporting:6.2f}   "
          f"{exporting / scrape:.2f}x of scraping (goal <= 1x)")
    print("  rule group                 interval  last evaluation")
    for group in rules.groups:
        took = durations.get(group.name, float("nan"))
        print(f"  {group.name:26} {group.interval or 'global':>8}  {took:8.3f} s")
    print_figures({"targets": args.targets, "records": records, "alerts": alerts,
                   "targets_up_scrape_only": up[bare.url], "targets_up_with_rules": up[ruled.url],
                   "cpu_per_cycle_scrape_only_s": scrape, "cpu_per_cycle_with_rules_s": both,
                   "ratio": both / scrape if scrape else float("nan"),
                   "rules_vs_scrape": (both - scrape) / scrape if scrape else float("nan"),
                   "targets_up_exporter": up[exporter_url], "exporter_cpu_per_cycle_s": exporting,
                   "exporter_vs_scrape": exporting / scrape if scrape else float("nan"),
                   "group_last_duration_s": {group.name: durations.get(group.name, float("nan"))
                                             for group in rules.groups}})
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve_forever(int(sys.argv[2]))
    else:
        raise SystemExit(main())
