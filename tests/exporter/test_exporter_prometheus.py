"""Truth test: a real Prometheus scrapes the same simulated fleet (and the captured real vLLM
payloads); the exporter's quantiles, means and goodput ratios equal what Prometheus computes with
histogram_quantile and bucket ratios, to a relative error of 1e-6.

Both see the same samples by design: the exporter's window spans a scrape taken before any
traffic (every counter zero) and one taken after the traffic stopped, so its increases are the
final cumulative values, which Prometheus holds once it has scraped the final state. Prometheus
is then queried on those raw values (no increase(), so no extrapolation differs)."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from crossover import catalog
from crossover.exporter.parse import Parser
from crossover.exporter.quantile import histogram_quantile
from crossover.exporter.service import Exporter
from crossover.netutil import free_port, spec_on_free_ports
from crossover.sim import fleet as sim_fleet
from crossover.slo import QUANTILES, SLO_HISTOGRAMS, quantile_label
from crossover.spec import load_spec
from tests.exporter.exporter_traffic import send
from tests.helpers import FIXTURES, SPECS, require_binary, serving_http, wait_for

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(180)]

FIXTURE_NAMES = ("idle", "under-load", "after-requests")


class _FixtureHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        name = self.path.strip("/").removesuffix("/metrics")
        path = FIXTURES / f"vllm-0.32.0-{name}.prom"
        if name not in FIXTURE_NAMES or not path.exists():
            self.send_error(404)
            return
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fixture_server() -> Iterator[str]:
    with serving_http(_FixtureHandler) as address:
        yield address


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expression: str) -> list[dict[str, Any]]:
        query = urllib.parse.urlencode({"query": expression})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{query}", timeout=10) as response:
            answer = json.loads(response.read())
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def scalar(self, expression: str) -> float:
        result = self.query(expression)
        assert len(result) == 1, (expression, result)
        return float(result[0]["value"][1])


@pytest.fixture
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    """Start a real Prometheus on a free loopback port for a given scrape config; stop it after."""
    binary = require_binary("prometheus")
    processes: list[subprocess.Popen[bytes]] = []

    def start(scrape_configs: list[dict[str, Any]]) -> Prometheus:
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
                                          "scrape_configs": scrape_configs}))
        port = free_port()
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        processes.append(process)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            try:
                with urllib.request.urlopen(url + "/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return Prometheus(url)
            except OSError:
                time.sleep(0.2)
        raise AssertionError("prometheus did not become ready")

    yield start
    for process in processes:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def close(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12)


@pytest.mark.slow
def test_quantiles_and_goodput_equal_prometheus(prometheus_for, fixture_server):
    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    jobs: list[dict[str, Any]] = [{
        "job_name": "vllm",
        "static_configs": [{"targets": [i.url.removeprefix("http://")],
                            "labels": {"topology": t.name, "replica": i.name}}
                           for t in spec.topologies for i in t.instances]}]
    jobs.append({"job_name": "fixture", "static_configs": [
        {"targets": [fixture_server], "labels": {"fixture": name, "__metrics_path__": f"/{name}/metrics"}}
        for name in FIXTURE_NAMES]})
    with sim_fleet.running_fleet(spec):
        prometheus = prometheus_for(jobs)
        count_name = catalog.TTFT.name + "_count"
        wait_for(lambda: len(prometheus.query(f'{count_name}{{job="vllm"}}')) == 3, 30,
                 "Prometheus scraping the three simulated instances")

        async def scenario() -> Exporter:
            exporter = Exporter(spec)
            async with aiohttp.ClientSession() as session:
                start = time.time()
                await exporter.cycle(session, now=start)
                for topology in spec.topologies:
                    await send([i.url for i in topology.instances], spec.model.name, 24, concurrency=8)
                await exporter.cycle(session, now=start + 30.0)
            return exporter

        exporter = asyncio.run(scenario())
        final = {h.target.instance: h.history.scrapes[-1] for h in exporter.health.values()}

        def prometheus_has_final_state() -> bool:
            # Every compared family's count, not just TTFT's: a scrape taken after the last first
            # token but before the last request finished has the final TTFT count and not the rest.
            for metric in SLO_HISTOGRAMS.values():
                family_count = metric.name + "_count"
                rows = prometheus.query(f'{family_count}{{job="vllm"}}')
                if len(rows) != len(final):
                    return False
                for row in rows:
                    scrape = final[row["metric"]["replica"]]
                    mine = sum(v for k, v in zip(scrape.keys, scrape.values, strict=True)
                               if k[0] == family_count)
                    if float(row["value"][1]) != mine:
                        return False
            return True

        wait_for(prometheus_has_final_state, 30, "Prometheus holding the final state")
        snapshot = exporter.snapshot
        compared = 0
        for level, views, selector in (
                ("topology", snapshot.topologies, lambda v: f'job="vllm",topology="{v.topology}"'),
                ("instance", snapshot.instances, lambda v: f'job="vllm",replica="{v.instance}"')):
            for view in views:
                derived = view.windows["1m"]
                for short, metric in SLO_HISTOGRAMS.items():
                    mine = derived.latency[short]
                    for q in QUANTILES:
                        series = f"{metric.name}_bucket{{{selector(view)}}}"
                        theirs = prometheus.scalar(f"histogram_quantile({q}, sum by (le) ({series}))")
                        assert close(mine.quantiles[quantile_label(q)], theirs), (level, view, short, q)
                        compared += 1
                    theirs_mean = prometheus.scalar(f"sum({metric.name}_sum{{{selector(view)}}}) / "
                                                    f"sum({metric.name}_count{{{selector(view)}}})")
                    assert close(mine.mean, theirs_mean), (level, view, short)
                for slo, attainment in derived.attainment.items():
                    metric = SLO_HISTOGRAMS[slo]
                    assert attainment.exact
                    # Find the exposed `le` string of the threshold (exact string matchers on `le`).
                    les = {row["metric"]["le"] for row in prometheus.query(
                        f"{metric.name}_bucket{{{selector(view)}}}")}
                    le = next(x for x in les if x != "+Inf" and float(x) == attainment.threshold_seconds)
                    theirs = prometheus.scalar(f'sum({metric.name}_bucket{{{selector(view)},le="{le}"}}) / '
                                               f"sum({metric.name}_count{{{selector(view)}}})")
                    assert close(attainment.ratio, theirs), (level, view, slo)
                    compared += 1
        assert compared >= 2 * 4 * 3 + 3 * 4 * 3

        # The captured real vLLM payloads, parsed by the exporter, against Prometheus's reading.
        wait_for(lambda: len(prometheus.query(f'{count_name}{{job="fixture"}}')) == len(FIXTURE_NAMES), 30,
                 "Prometheus scraping the captured payloads")
        parser = Parser()
        for name in FIXTURE_NAMES:
            parsed = parser.series((FIXTURES / f"vllm-0.32.0-{name}.prom").read_text())
            for metric in SLO_HISTOGRAMS.values():
                buckets: dict[float, float] = {}
                for (sample, labels), value in parsed.items():
                    if sample == metric.name + "_bucket":
                        le = float(dict(labels)["le"])
                        buckets[le] = buckets.get(le, 0.0) + value
                for q in QUANTILES:
                    theirs = prometheus.scalar(f'histogram_quantile({q}, sum by (le) '
                                               f'({metric.name}_bucket{{job="fixture",fixture="{name}"}}))')
                    assert close(histogram_quantile(q, list(buckets.items())), theirs), (name, metric.name, q)
