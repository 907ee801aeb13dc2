"""Failed requests count the same on both sides: a sweep against the simulator with one instance of
tp2x2 failing half its requests as engine errors (latency within every SLO), and the servers' own
view of the same level (`LEVEL.server.json`: each instance's /metrics before and after, derived as
the exporter derives them). The client's attainment and the servers' agree within the sampling
noise of the failed share; without the failure-aware definition the servers said 1.0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import running_fleet
from crossover.spec import Fault, FleetSpec, load_spec
from tests.helpers import SPECS

pytestmark = [pytest.mark.timeout(240)]
REQUESTS = 160


def test_client_and_server_attainment_agree_under_engine_errors(tmp_path: Path) -> None:
    data = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")).model_dump(mode="json")
    data["simulator"]["faults"] = {"tp2-0": Fault(error_rate=0.5).model_dump(mode="json")}
    spec = FleetSpec.model_validate(data)
    plan = SweepPlan(levels=(4,), requests_per_level=REQUESTS, input_len=LengthDist.fixed(32),
                     output_len=LengthDist.fixed(8))
    with running_fleet(spec):
        result = run_sweep(spec, plan, tmp_path, ["tp2x2"], n_boot=0)
    client = result.summary.iloc[0]
    figures = json.loads((tmp_path / "levels" / "tp2x2" / "c4.server.json").read_text())["figures"]
    failed = client["failed"] / client["requests"]
    assert failed > 0.1, client  # about half of one instance's requests (fast failures come back sooner)
    # the binomial noise of the failed share over the counted requests, three sigma
    noise = 3 * (failed * (1 - failed) / client["requests"]) ** 0.5
    for kind in ("ttft", "tpot"):
        server = figures[f"attainment_ratio{{{kind}}}"]
        assert server == pytest.approx(client[f"attainment_{kind}"], abs=noise), (kind, server, dict(client))
    assert figures["attainment_upper_ratio"] == pytest.approx(client["attainment"], abs=noise)
    assert figures["failed_requests_per_second{error}"] > 0
    assert figures["failures_counted"] == 1.0
