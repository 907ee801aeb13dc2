"""Live: the generated rules in a real Prometheus see a P/D topology as its users do. On the same
traffic as the client (30 streamed 1,500-token prompts through the entrypoint, 4 at a time), the
topology's request count is the requests sent, and its mean and p99 TTFT agree with the client's
within the bucket resolution."""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

import pytest

from crossover import catalog
from crossover.netutil import spec_on_free_ports
from crossover.rules import model as m
from crossover.rules.generate import Format, outputs
from crossover.rules.names import (
    mean_name,
    quantile_name,
    rate_name,
    requests_source_name,
)
from crossover.rules.prom import running_prometheus
from crossover.spec import FleetSpec, load_spec
from tests.exporter.exporter_traffic import send
from tests.helpers import SPECS, agree_within_bucket, client_quantile, require_binary

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(240)]

REQUESTS = 30
PROMPT_TOKENS = 1500
WINDOW = "1m"


def _spec(dialect: str | None) -> FleetSpec:
    data = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml")).model_dump(mode="json")
    data["scrape"].update({"interval": "1s", "timeout": "1s", "windows": [WINDOW]})
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d" and dialect is not None:
            topology["entrypoint"]["dialect"] = dialect  # the simulator's proxy serves it, the rules read it
    return FleetSpec.model_validate(data)


@pytest.mark.parametrize("dialect", [None, catalog.LLMD_DIALECT.name, catalog.PRODUCTION_STACK_DIALECT.name])
def test_rules_count_each_request_once_with_the_users_ttft(dialect: str | None) -> None:
    """Behind crossover's proxy (vLLM's names), behind llm-d's router (its own names and buckets,
    turned into vLLM's by the scrape config's metric relabelling and read by the same rules), and
    behind production-stack's (requests from it, never summed with its vLLM-named gauges; no TTFT)."""
    require_binary("prometheus")
    from crossover.sim.fleet import running_fleet

    spec = _spec(dialect)
    buckets = catalog.TTFT.buckets if dialect is None else catalog.LLMD_TTFT_BUCKETS
    rules = m.build_rules(spec, m.RulesConfig(), "pd-8k-prompts.yaml")
    entrypoint = spec.topology("pd1p1d").entrypoint.url
    assert entrypoint is not None
    with tempfile.TemporaryDirectory(prefix="crossover-pd-") as folder, running_fleet(spec):
        for name, text in outputs(spec, rules, Format.PLAIN, "pd-8k-prompts.yaml", "pd").items():
            (Path(folder) / name).write_text(text)
        with running_prometheus(Path(folder) / "prometheus.yml") as prometheus:
            targets = sum(len(t.instances) + bool(t.entrypoint.metrics_url) for t in spec.topologies)
            prometheus.wait_until(lambda: list(prometheus.targets_up().values()).count("up") == targets,
                                  60, f"all {targets} targets up")
            scraped_from = time.time()
            time.sleep(3)  # a few scrapes of every counter at zero before the traffic
            timed = asyncio.run(send([entrypoint], spec.model.name, REQUESTS, concurrency=4,
                                     prompt_tokens=(PROMPT_TOKENS,), max_tokens=16))
            # Prometheus has stored the proxy's final count (a loaded machine delays scrapes and rule
            # evaluations), and every rule read below was evaluated after that.
            # (e2e latency: observed as each request ends, whichever router counts it, where llm-d's
            # request counter moves on arrival.)
            finished = f'sum({catalog.E2E_LATENCY.name}_count{{role="entrypoint",topology="pd1p1d"}})'
            prometheus.wait_until(lambda: [s.value for s in prometheus.query(finished)] == [REQUESTS],
                                  60, "the proxy's final request count scraped")
            counted = time.time()
            read = (rate_name(catalog.REQUEST_SUCCESS, WINDOW), mean_name(catalog.TTFT, WINDOW),
                    quantile_name(catalog.TTFT, 0.99, WINDOW),
                    rate_name(catalog.REQUEST_SUCCESS, WINDOW, "topology_role"))

            def evaluated_since_counted() -> bool:
                stamps = [s.value for name in read
                          for s in prometheus.query(f'timestamp({name}{{topology="pd1p1d"}})')]
                return len(stamps) == len(read) + 2 and min(stamps) > counted + 1  # 3 roles

            prometheus.wait_until(evaluated_since_counted, 60, "the rules evaluated after the last scrape")

            def one(name: str) -> float:
                (sample,) = prometheus.query(f'{name}{{topology="pd1p1d"}}')
                return sample.value

            span = time.time() - scraped_from
            source = {s.labels["topology"]: s.labels["source"]
                      for s in prometheus.query(requests_source_name())}
            per_second = one(rate_name(catalog.REQUEST_SUCCESS, WINDOW))
            roles = {s.labels["role"]: s.value * 60 for s in prometheus.query(
                f'{rate_name(catalog.REQUEST_SUCCESS, WINDOW, "topology_role")}{{topology="pd1p1d"}}')}
            mean = one(mean_name(catalog.TTFT, WINDOW))
            p99 = one(quantile_name(catalog.TTFT, 0.99, WINDOW))
            router_gauges = prometheus.query(
                f'{catalog.NUM_REQUESTS_RUNNING.name}{{role="entrypoint",topology="pd1p1d"}}')
            marked = prometheus.query('{__tmp_crossover_keep!=""}')  # the relabelling's own mark
    assert source == {"colocated": "instances", "pd1p1d": "entrypoint"}
    # rate() extrapolates the increase it saw by up to one scrape interval (1 s) at either end of the
    # samples it has: of the whole window, or since Prometheus started when that is shorter.
    assert per_second * 60 == pytest.approx(REQUESTS, rel=2 / min(span, 60)), (per_second, span, roles)
    assert set(roles) == {"prefill", "decode", "entrypoint"}  # each role saw every request once
    assert router_gauges == []  # production-stack's vLLM-named gauges dropped at the scrape
    assert marked == []
    client = [t.ttft for t in timed]
    client_mean = sum(client) / len(client)
    if dialect == catalog.PRODUCTION_STACK_DIALECT.name:
        # Its router has no TTFT: the topology's is decode-side, shorter than what the client waited.
        assert mean < client_mean
        return
    # The mean is exact (sum over count); the proxy stamps a loopback hop inside the client's stamps.
    assert mean <= client_mean and agree_within_bucket(mean, client_mean, buckets)
    client_p99 = client_quantile(client, 0.99)
    assert agree_within_bucket(p99, client_p99, buckets), (p99, client_p99)
