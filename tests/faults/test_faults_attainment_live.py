"""One traffic, three readers: a sweep against the simulator with one instance of tp2x2 failing half
its requests as engine errors (latency within every SLO), the crossover exporter scraping the same
fleet, and a real Prometheus scraping fleet and exporter with the generated recording rules. The
sweep's client-side attainment, the exporter's attainment and the rules' SLI agree within the
sampling noise of the failed share (the sibling test_faults_attainment.py compares the client with
the servers' own before/after view). Loopback only; 160 requests; every process stopped on failure.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from crossover import slo
from crossover.exporter import names
from crossover.exporter.service import Exporter, running_exporter
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.rules import model as m
from crossover.rules.generate import Format, outputs
from crossover.rules.names import attainment_name, joint_attainment_name
from crossover.sim.fleet import running_fleet
from crossover.spec import Fault, FleetSpec, load_spec
from tests.faults.faults_stack import running_prometheus
from tests.helpers import SPECS

pytestmark = [pytest.mark.prometheus, pytest.mark.slow, pytest.mark.timeout(300)]
REQUESTS = 160
TOPOLOGY = "tp2x2"
SCRAPE_S = 1.0


def _faulted_spec() -> FleetSpec:
    data = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")).model_dump(mode="json")
    data["scrape"].update({"interval": f"{SCRAPE_S:g}s", "timeout": f"{SCRAPE_S:g}s"})
    data["simulator"]["faults"] = {"tp2-0": Fault(error_rate=0.5).model_dump(mode="json")}
    return FleetSpec.model_validate(data)


def test_sweep_exporter_and_rules_agree_under_engine_errors(tmp_path: Path) -> None:
    spec = _faulted_spec()
    rules = m.build_rules(spec, m.RulesConfig(), "seed-70b-h100.yaml")
    # the longest raw window (recorded from raw rates, not averaged from shorter recordings)
    window_s, window = max(zip(spec.scrape.window_seconds, spec.scrape.windows, strict=True))
    plan = SweepPlan(levels=(4,), requests_per_level=REQUESTS, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(8))
    with running_fleet(spec), running_exporter(Exporter(spec)) as exporter_url:
        target = str(exporter_url).removeprefix("http://")
        for name, text in outputs(spec, rules, Format.PLAIN, "seed-70b-h100.yaml", "seed", target).items():
            (tmp_path / name).write_text(text)
        with running_prometheus(tmp_path / "prometheus.yml") as prometheus:
            targets = sum(len(t.instances) + (1 if t.entrypoint.metrics_url else 0)
                          for t in spec.topologies) + 1
            # a few scrapes of every target before the first request, so every rate sees all of it
            prometheus.wait_until(lambda: len(prometheus.query("count_over_time(up[10s]) >= 4")) == targets,
                                  60, f"four scrapes of all {targets} targets")
            started = time.time()
            result = run_sweep(spec, plan, tmp_path / "sweep", [TOPOLOGY], n_boot=0)
            ended = time.time()
            took = ended - started
            assert took < window_s - 10 * SCRAPE_S, f"a {took:.0f}s sweep outgrows the {window} window"
            # read once every group has evaluated after the last scrape that saw the sweep's end
            fast = max(g.interval_s or SCRAPE_S for g in rules.groups if g.name == "crossover-topology")
            at = ended + 3 * SCRAPE_S + fast
            time.sleep(max(0.0, at + SCRAPE_S - time.time()))

            def read(expr: str) -> float:
                samples = [s for s in prometheus.query(expr, at) if s.labels.get("topology") == TOPOLOGY]
                assert len(samples) == 1, (expr, samples)
                return samples[0].value

            client = result.summary.iloc[0]
            failed = client["failed"] / client["requests"]
            assert failed > 0.1, dict(client)  # about half of one instance's requests
            noise = 3 * (failed * (1 - failed) / client["requests"]) ** 0.5  # binomial, three sigma
            compared: dict[str, tuple[float, float, float]] = {}
            ratio = names.derived_name("topology", f"{slo.ATTAINMENT}_ratio")
            for bucket in rules.slo_buckets:
                column = slo.attainment_column(bucket.slo)
                if column not in client:
                    continue
                exported = f'{ratio}{{window="{window}",slo="{bucket.slo}"}}'
                compared[bucket.slo] = (client[column], read(exported),
                                        read(attainment_name(bucket.slo, window)))
            joint = names.derived_name("topology", f"{slo.ATTAINMENT}_upper_ratio")
            exported_joint = f'{joint}{{window="{window}"}}'
            compared["joint"] = (client[slo.attainment_column()], read(exported_joint),
                                 read(joint_attainment_name("upper", window)))
    print(f"\nfailed share {failed:.3f} (noise {noise:.3f}); client, exporter, rules: {compared}")
    assert {"ttft", "tpot"} <= set(compared), compared
    for kind, (ours, exporter, recorded) in compared.items():
        assert exporter == pytest.approx(ours, abs=noise), (kind, compared)
        assert recorded == pytest.approx(ours, abs=noise), (kind, compared)
        assert recorded < 0.95, (kind, compared)  # the histogram-only ratio would say 1.0
