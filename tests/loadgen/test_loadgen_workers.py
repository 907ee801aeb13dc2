"""--workers and --shard: a level's seeded requests split over processes (and machines), merged
into the one level file with the same requests, indices and concurrency as one process sends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.analysis.results import SERVER_SUFFIX, level_path, load_run, merge_runs
from crossover.loadgen.plan import Endpoint, LengthDist, Mode, SweepPlan
from crossover.loadgen.sweep import Traffic, run_sweep
from crossover.loadgen.traffic.workers import Share, parse_shard, shares
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS
from tests.loadgen.loadgen_fake_server import Behaviour, FakeServer, fake_fleet

CLOSED = SweepPlan(levels=(1, 3, 8), rounds=3, input_len=LengthDist.parse("uniform:4-12"),
                   output_len=LengthDist.fixed(4))
OPEN = SweepPlan(mode=Mode.OPEN, levels=(20, 60), requests_per_level=30, input_len=LengthDist.fixed(6),
                 output_len=LengthDist.fixed(4))


@pytest.mark.parametrize("plan", [CLOSED, OPEN], ids=["closed", "open"])
@pytest.mark.parametrize("count", [2, 3, 5])
def test_shares_split_requests_and_clients_without_overlap(plan: SweepPlan, count: int) -> None:
    for level in plan.levels:
        total = plan.requests_for(level)
        assert total is not None
        owners = [[s.index for s in shares(count) if s.owns(plan, level, i)] for i in range(total)]
        assert all(len(o) == 1 for o in owners)  # every request sent once, by one share
        if plan.mode is Mode.CLOSED:
            clients = sorted(c for s in shares(count) for c in (s.clients(level)
                                                                if s.index < s.active(plan, level) else []))
            assert clients == list(range(int(level)))
            for share in shares(count):  # requests in proportion to clients
                mine = sum(1 for o in owners if o == [share.index])
                active = share.index < share.active(plan, level)
                assert mine == (plan.rounds * len(share.clients(level)) if active else 0)


def test_shards_of_machines_are_consecutive_shares() -> None:
    assert parse_shard("1/3") == (1, 3) and parse_shard(None) == (0, 1)
    assert shares(2, (1, 3)) == [Share(2, 6), Share(3, 6)]
    # three machines x two workers own every request once
    everyone = [s for m in range(3) for s in shares(2, (m, 3))]
    assert sorted(s.index for s in everyone) == list(range(6))


@pytest.fixture
def fleet() -> Iterator[tuple[FleetSpec, dict[str, FakeServer]]]:
    with fake_fleet(lambda name: Behaviour(ttft_s=0.01, tpot_s=0.004)) as made:
        yield made


KEY = ["topology", "level", "index", "planned_input", "planned_output", "ok"]


@pytest.mark.slow
@pytest.mark.parametrize("plan", [CLOSED, OPEN], ids=["closed", "open"])
def test_two_workers_send_what_one_sends_into_one_level_file(
        fleet: tuple[FleetSpec, dict[str, FakeServer]], plan: SweepPlan, tmp_path: Path) -> None:
    spec, servers = fleet
    one = run_sweep(spec, plan, tmp_path / "one", ["big1x2c"], n_boot=0)
    big = servers["big-0"]
    big.max_in_flight = 0
    prompts_one = sorted(b["prompt"] for b in big.bodies)
    big.bodies.clear()
    shown: dict[float, int] = {}  # the progress the CLI shows: requests done so far, per level
    two = run_sweep(spec, plan, tmp_path / "two", ["big1x2c"], n_boot=0, traffic=Traffic(workers=2),
                    on_request=lambda topology, level, done, total: shown.__setitem__(level, done))
    assert two.requests["ok"].all(), two.requests["error"].unique()
    assert shown == two.requests.groupby("level").size().to_dict()
    pd.testing.assert_frame_equal(one.requests[KEY], two.requests[KEY])
    assert sorted(b["prompt"] for b in big.bodies) == prompts_one  # the same seeded requests
    for level in plan.levels:  # merged: one file per level, in index order
        path = level_path(tmp_path / "two", plan, "big1x2c", level)
        frame = pd.read_parquet(path)
        assert frame["index"].tolist() == list(range(len(frame)))
        # the servers were scraped around the workers' level (the fake ones serve no /metrics)
        view = json.loads(path.with_suffix(SERVER_SUFFIX).read_text())
        assert view["start"] <= frame["send_time"].min() and frame["end_time"].max() <= view["end"]
        assert list(view["scrape_errors"]) == [spec.topology("big1x2c").instances[0].name]
    if plan.mode is Mode.CLOSED:
        assert big.max_in_flight == max(plan.levels)  # the concurrency divided, not doubled
    else:
        # arrivals keep their plan: each level's sends span about the same time in both runs
        for level in plan.levels:
            sends = [r.loc[r["level"] == level, "send_time"] for r in (one.requests, two.requests)]
            spans = [float(s.max() - s.min()) for s in sends]
            assert spans[1] == pytest.approx(spans[0], rel=0.3, abs=0.05)
    figures = ["requests", "ok", "failed"]
    pd.testing.assert_frame_equal(one.summary[figures], two.summary[figures])


@pytest.mark.slow
def test_a_shard_sends_only_its_share(fleet: tuple[FleetSpec, dict[str, FakeServer]], tmp_path: Path) -> None:
    spec, _ = fleet
    plan = SweepPlan(levels=(1, 4), rounds=2, input_len=LengthDist.fixed(4), output_len=LengthDist.fixed(4))
    parts = [run_sweep(spec, plan, tmp_path / f"m{m}", ["big1x2c"], n_boot=0, traffic=Traffic(shard=(m, 2)))
             for m in range(2)]
    whole = run_sweep(spec, plan, tmp_path / "whole", ["big1x2c"], n_boot=0)
    merged = pd.concat([p.requests for p in parts]).sort_values(["level", "index"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(merged[KEY], whole.requests[KEY])
    # concurrency 1 has one client: the second machine's level 1 is an empty file, still a finished level
    assert level_path(tmp_path / "m1", plan, "big1x2c", 1).exists()
    assert not (parts[1].requests["level"] == 1).any()
    # the machines' folders merged are the one-machine run: same requests, same figures
    run = merge_runs([tmp_path / "m1", tmp_path / "m0"], tmp_path / "merged", n_boot=0)
    pd.testing.assert_frame_equal(run.requests[KEY], whole.requests[KEY])
    assert run.summary["requests"].tolist() == whole.summary["requests"].tolist()
    assert load_run(tmp_path / "merged").info.plan == plan
    with pytest.raises(UserError, match=r"^shards: want each of 0/2 to 1/2 once, got 0/2"):
        merge_runs([tmp_path / "m0"], tmp_path / "partial")
    with pytest.raises(UserError, match=r"^--shard: .* holds shard 0/2's requests, not 1/2's"):
        run_sweep(spec, plan, tmp_path / "m0", ["big1x2c"], n_boot=0, traffic=Traffic(shard=(1, 2)))


@pytest.mark.slow
def test_workers_stop_with_the_sweep(fleet: tuple[FleetSpec, dict[str, FakeServer]], tmp_path: Path) -> None:
    spec, servers = fleet
    for server in servers.values():
        server.behaviour.tpot_s = 0.05
    stop = threading.Event()
    plan = SweepPlan(levels=(4, 8), rounds=20, input_len=LengthDist.fixed(4), output_len=LengthDist.fixed(8))

    def on_request(topology: str, level: float, done: int, total: int | None) -> None:
        stop.set()

    result = run_sweep(spec, plan, tmp_path, ["big1x2c"], stop=stop, on_request=on_request, n_boot=0,
                       traffic=Traffic(workers=2))
    assert result.stopped and not result.measured_levels
    assert not level_path(tmp_path, plan, "big1x2c", 4).exists()


@pytest.mark.slow
def test_shards_from_the_cli_merge_with_crossover_analyze(
        fleet: tuple[FleetSpec, dict[str, FakeServer]], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = fleet
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(json.dumps(spec.model_dump(mode="json")))
    common = ["sweep", str(spec_path), "--concurrency", "2,4", "--rounds", "2", "--input-len", "4",
              "--output-len", "4", "--no-progress", "--bootstrap", "0"]
    for machine in range(2):
        assert main([*common, "--out", str(tmp_path / f"m{machine}"), "--shard", f"{machine}/2",
                     "--workers", "2"]) == 0
    capsys.readouterr()
    assert main(["analyze", str(tmp_path / "m0"), str(tmp_path / "m1"), "--out", str(tmp_path / "all"),
                 "--bootstrap", "0"]) == 0
    assert "2 shard folders merged into" in capsys.readouterr().out
    run = load_run(tmp_path / "all")
    # every request of the plan once: 2 x 2 + 2 x 4 per topology
    assert run.requests.groupby("topology").size().tolist() == [12, 12]
    assert sorted(run.requests[run.requests["level"] == 4]["index"].tolist()[:8]) == list(range(8))
    assert main(["analyze", str(tmp_path / "m0"), "--out", str(tmp_path / "half")]) == 2
    assert capsys.readouterr().err.startswith("crossover analyze: shards: want each of 0/2 to 1/2 once")


@pytest.mark.parametrize(("plan", "traffic", "message"), [
    (SweepPlan(levels=(4,), duration_s=5), Traffic(workers=2), "^--workers: a closed-loop level that runs"),
    (SweepPlan(levels=(4,), rounds=2, turns=3, endpoint=Endpoint.CHAT), Traffic(shard=(0, 2)),
     "^--workers, --shard: a multi-turn"),
])
def test_what_cannot_be_split_is_refused_before_traffic(plan: SweepPlan, traffic: Traffic, message: str,
                                                        tmp_path: Path) -> None:
    spec = load_spec(SPECS / "cpu-real-vllm.yaml")  # nothing listens there: traffic would fail
    with pytest.raises(UserError, match=message):
        run_sweep(spec, plan, tmp_path / "run", n_boot=0, traffic=traffic)
    assert not (tmp_path / "run").exists()
