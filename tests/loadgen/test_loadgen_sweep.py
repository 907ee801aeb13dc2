"""Sweeps end to end against loopback servers: files per level, resume, stop, balancing, the CLI."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from crossover import slo
from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen import sweep as sweep_module
from crossover.loadgen.analysis.report import CrossoverReport
from crossover.loadgen.analysis.results import load_run
from crossover.loadgen.analysis.summary import per_gpu
from crossover.loadgen.plan import LengthDist, Mode, SweepPlan
from crossover.loadgen.sweep import LevelDone, run_sweep
from crossover.spec import FleetSpec, load_spec, parse_spec
from tests.helpers import SPECS
from tests.loadgen.loadgen_fake_server import Behaviour, FakeServer, fake_fleet

PLAN = SweepPlan(levels=(1, 2, 4), rounds=2, input_len=LengthDist.fixed(8), output_len=LengthDist.fixed(5))


@pytest.fixture
def fleet() -> Iterator[tuple[FleetSpec, dict[str, FakeServer]]]:
    """cpu-real-vllm.yaml's shape (one instance vs two balanced) on fake servers."""
    with fake_fleet(lambda name: Behaviour(ttft_s=0.005, tpot_s=0.002)) as made:
        yield made


@pytest.mark.slow
def test_sweep_writes_every_level_and_resumes(fleet: tuple[FleetSpec, dict[str, FakeServer]],
                                              tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec, servers = fleet
    seen: list[LevelDone] = []
    result = run_sweep(spec, PLAN, tmp_path, on_level=seen.append, n_boot=20)
    assert not result.stopped
    assert [(e.topology, e.level) for e in seen] == [(t, lv) for lv in (1.0, 2.0, 4.0)
                                                     for t in ("big1x2c", "small2x1c")]
    assert seen[-1].position == seen[-1].total == 6 and not seen[0].resumed
    assert len(result.requests) == 2 * (2 + 4 + 8) and result.requests["ok"].all()
    assert set(result.summary["topology"]) == {"big1x2c", "small2x1c"} and len(result.summary) == 6
    # the same requests went to both topologies
    big = result.requests[result.requests["topology"] == "big1x2c"]
    small = result.requests[result.requests["topology"] == "small2x1c"]
    prompts = {tuple(b["prompt"]) for s in ("small-0", "small-1") for b in servers[s].bodies}
    assert prompts == {tuple(b["prompt"]) for b in servers["big-0"].bodies}
    # token-id prompts of exactly the planned length, as the server counted them
    assert (result.requests["input_tokens"] == 8).all() and (result.requests["planned_input"] == 8).all()
    assert not result.summary["input_len_off"].any()
    assert big["planned_input"].tolist() == small["planned_input"].tolist()
    # balanced over both small instances, one instance for the big one
    assert len(servers["small-0"].bodies) > 0 and len(servers["small-1"].bodies) > 0
    assert set(small["instance"]) == {servers["small-0"].url, servers["small-1"].url}
    # files
    assert (tmp_path / "summary.csv").exists() and (tmp_path / "summary.parquet").exists()
    crossover = json.loads((tmp_path / "crossover.json").read_text())
    assert crossover["axis"] == "concurrency" and crossover["sentences"]
    assert len(list((tmp_path / "levels").glob("*/*.parquet"))) == 6
    run = load_run(tmp_path)
    assert len(run.requests) == len(result.requests)
    assert run.info.plan == PLAN and run.info.gpus == {"big1x2c": 2, "small2x1c": 2}
    pd.testing.assert_frame_equal(run.summary, result.summary)
    assert isinstance(run.requests["itl"].iloc[0], list)
    # a crash loses at most the level in progress: remove one level, rerun, only it is measured
    (tmp_path / "levels" / "small2x1c" / "c4.parquet").unlink()
    sent_before = len(servers["big-0"].bodies)
    analyses: list[int] = []  # requests each analysis saw
    analyze = sweep_module.analyze

    def counted(summary: pd.DataFrame, requests: pd.DataFrame, **kwargs: Any) -> CrossoverReport:
        analyses.append(len(requests))
        return analyze(summary, requests, **kwargs)

    monkeypatch.setattr(sweep_module, "analyze", counted)
    seen.clear()
    again = run_sweep(spec, PLAN, tmp_path, on_level=seen.append, n_boot=0)
    assert again.measured_levels == [("small2x1c", 4.0)] and again.resumed_levels == 5
    # the five resumed levels are analysed once, before the measured one; every level is announced
    assert analyses == [len(result.requests) - 8, len(result.requests)]
    assert [(e.topology, e.level, e.position, e.resumed) for e in seen] == [
        (t, lv, i + 1, (t, lv) != ("small2x1c", 4.0))
        for i, (lv, t) in enumerate((lv, t) for lv in (1.0, 2.0, 4.0) for t in ("big1x2c", "small2x1c"))]
    assert len(servers["big-0"].bodies) == sent_before
    # a different plan in the same folder is refused
    with pytest.raises(UserError, match="different plan"):
        run_sweep(spec, SweepPlan(levels=(1,), rounds=1), tmp_path)


@pytest.mark.slow
def test_a_folder_written_with_the_old_goodput_names_loads_and_resumes(
        fleet: tuple[FleetSpec, dict[str, FakeServer]], tmp_path: Path) -> None:
    spec, _ = fleet
    plan = SweepPlan(levels=(1, 2), rounds=1, input_len=LengthDist.fixed(4), output_len=LengthDist.fixed(3))
    run_sweep(spec, plan, tmp_path, n_boot=0)
    # as the release before the rename wrote them: crossings of "goodput", columns "goodput_per_gpu"...
    path = tmp_path / "crossover.json"
    text = path.read_text().replace(f'"{slo.GOODPUT_REQUESTS}"', '"goodput"')
    path.write_text(text.replace(f'"{slo.GOODPUT_TOKENS}"', '"token_goodput"'))
    summary = pd.read_parquet(tmp_path / "summary.parquet")
    old = {slo.GOODPUT_REQUESTS: "goodput", slo.GOODPUT_TOKENS: "token_goodput",
           per_gpu(slo.GOODPUT_REQUESTS): "goodput_per_gpu",
           per_gpu(slo.GOODPUT_TOKENS): "token_goodput_per_gpu"}
    summary.rename(columns=old).to_parquet(tmp_path / "summary.parquet", index=False)
    assert '"goodput"' in path.read_text()
    metrics = {c.metric for c in load_run(tmp_path).crossover.crossovers}
    assert slo.GOODPUT_REQUESTS in metrics and "goodput" not in metrics
    (tmp_path / "levels" / "big1x2c" / "c2.parquet").unlink()
    again = run_sweep(spec, plan, tmp_path, n_boot=0)
    assert again.measured_levels == [("big1x2c", 2.0)] and again.resumed_levels == 3
    assert per_gpu(slo.GOODPUT_REQUESTS) in pd.read_parquet(tmp_path / "summary.parquet")


def test_stop_event_ends_the_sweep_quickly_and_discards_the_partial_level(tmp_path: Path) -> None:
    spec = load_spec(SPECS / "cpu-real-vllm.yaml")
    data = spec.model_dump(mode="json")
    with ExitStack() as stack:
        for topology in data["topologies"]:
            for instance in topology["instances"]:
                instance["url"] = stack.enter_context(FakeServer(Behaviour(hang=True))).url
        stop = threading.Event()
        threading.Timer(0.5, stop.set).start()
        started = time.monotonic()
        result = run_sweep(parse_spec(data), SweepPlan(levels=(1, 2), rounds=1, timeout_s=60), tmp_path,
                           stop=stop)
        elapsed = time.monotonic() - started
    assert result.stopped and result.requests.empty and not result.measured_levels
    assert elapsed < 5  # not the 60 s request timeout
    assert not list(tmp_path.glob("levels/*/*.parquet"))


def test_open_loop_errors_and_timeouts_count_as_failed(tmp_path: Path) -> None:
    spec = load_spec(SPECS / "cpu-real-vllm.yaml")
    data = spec.model_dump(mode="json")
    with FakeServer(Behaviour(status=500)) as bad, FakeServer(Behaviour(hang=True)) as hung, \
            FakeServer() as good:
        urls = {"big-0": good.url, "small-0": bad.url, "small-1": hung.url}
        for topology in data["topologies"]:
            topology["entrypoint"] = {"balance": "round_robin"}
            for instance in topology["instances"]:
                instance["url"] = urls[instance["name"]]
        plan = SweepPlan(mode=Mode.OPEN, levels=(20.0,), requests_per_level=6, timeout_s=0.5,
                         input_len=LengthDist.fixed(4), output_len=LengthDist.fixed(3))
        result = run_sweep(parse_spec(data), plan, tmp_path, n_boot=0)
    rows = result.summary.set_index("topology")
    assert rows.at["big1x2c", "failed"] == 0 and rows.at["big1x2c", "attainment"] == 1.0
    assert rows.at["small2x1c", "failed"] == 6 and rows.at["small2x1c", slo.GOODPUT_REQUESTS] == 0
    assert rows.at["small2x1c", "attainment"] == 0 and rows.at["small2x1c", "offered_rate"] == 20.0
    errors = set(result.requests.loc[result.requests["topology"] == "small2x1c", "error"])
    assert any("HTTP 500" in e for e in errors) and "timeout after 0.5 s" in errors


@pytest.mark.slow
def test_cli_sweep_prints_tables_and_writes_files(fleet: tuple[FleetSpec, dict[str, FakeServer]],
                                                 tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec, _ = fleet
    spec_path = tmp_path / "spec.yaml"
    import yaml

    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    out = tmp_path / "run"
    code = main(["sweep", str(spec_path), "--concurrency", "1,2", "--rounds", "1", "--input-len", "4",
                 "--output-len", "3", "--out", str(out), "--bootstrap", "10", "--csv", "--slo", "ttft:1000"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "sweep summary" in captured.out and "big1x2c" in captured.out
    assert "big1x2c concurrency 2:" in captured.err  # a line per level when not on a terminal
    assert (out / "levels" / "big1x2c" / "c2.csv").exists()
    assert load_run(out).info.slos_ms == {"ttft": 1000.0}


@pytest.mark.parametrize(("argv", "message"), [
    (["--concurrency", "0"], "every level must be positive"),
    (["--rate", "1"], "needs requests_per_level or duration_s"),
    (["--concurrency", "1", "--topology", "nope"], "no topology named 'nope'"),
    (["--concurrency", "1", "--slo", "ttft"], "--slo 'ttft'"),
    ([], "give --concurrency (closed loop) or --rate"),
    (["--request-rate", "inf"], "give --max-concurrency"),
    (["--max-concurrency", "4", "--request-rate", "2"], "a rate capped by a concurrency"),
    (["--request-rate", "2"], "needs requests_per_level or duration_s"),
])
def test_cli_errors_are_one_line(argv: list[str], message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["sweep", str(SPECS / "cpu-real-vllm.yaml"), "--out", str(tmp_path / "x"), *argv])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_load_run_of_a_non_run_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="not a sweep folder"):
        load_run(tmp_path)
