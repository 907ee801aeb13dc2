"""`crossover analyze` on the peer tools' own result files: GuideLLM 0.8.1 and 0.7.1, AIPerf 0.13.0
and inference-perf 0.7.0, as scripts/capture-peer-fixtures captured them against the simulator
(tests/fixtures/peers/). Each level's imported requests are checked against the aggregates the tool
itself wrote, read here straight from its files."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.analysis.imports import Level, read_results
from crossover.loadgen.analysis.imports.common import CLIENT_OUTPUT_TOKENS
from crossover.loadgen.analysis.results import load_run
from crossover.loadgen.plan import Mode
from tests.helpers import FIXTURES

PEERS = FIXTURES / "peers"
TOPOLOGIES = ["tp2x2", "tp4x1"]
# fixture folder (one load axis each) -> tool, axis, levels per topology
CAPTURED = {
    "guidellm-0.8.1/concurrent": ("guidellm 0.8.1", Mode.CLOSED, 2),
    "guidellm-0.8.1/sweep": ("guidellm 0.8.1", Mode.OPEN, 3),
    "guidellm-0.8.1/constant": ("guidellm 0.8.1", Mode.OPEN, 2),
    "guidellm-0.7.1/constant": ("guidellm 0.7.1", Mode.OPEN, 2),
    "guidellm-0.7.1/concurrent": ("guidellm 0.7.1", Mode.CLOSED, 2),
    "guidellm-0.7.1/sweep": ("guidellm 0.7.1", Mode.OPEN, 3),
    "aiperf-0.13.0": ("aiperf 0.13.0", Mode.CLOSED, 2),
    "inference-perf-0.7.0": ("inference-perf", Mode.CLOSED, 2),
}


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def _ok(level: Level) -> Any:
    return level.requests[level.requests["ok"]]


def _check_guidellm(levels: list[Level]) -> None:
    for path in sorted({level.path for level in levels}):
        text = path.read_text()
        data = yaml.load(text, Loader=yaml.CSafeLoader) if path.suffix == ".yaml" else json.loads(text)
        mine = sorted((lv for lv in levels if lv.path == path), key=lambda lv: lv.requests["send_time"].min())
        benchmarks = sorted(data["benchmarks"], key=lambda b: b["start_time"])
        assert len(mine) == len(benchmarks)
        sweep = data["config"]["spec"]["profile"]["kind"] == "sweep"
        for level, benchmark in zip(mine, benchmarks, strict=True):
            metrics = benchmark["metrics"]
            assert len(level.requests) == metrics["request_totals"]["total"]
            ok = _ok(level)
            assert len(ok) == metrics["request_totals"]["successful"]
            assert _close(ok["ttft"].mean() * 1000, metrics["time_to_first_token_ms"]["successful"]["mean"])
            assert _close(ok["e2e"].mean(), metrics["request_latency"]["successful"]["mean"])
            assert ok["output_tokens"].sum() == metrics["output_token_count"]["successful"]["total_sum"]
            strategy = benchmark["config"]["strategy"]
            if sweep:  # the rate axis at the run's achieved request rate
                assert _close(level.level, len(level.requests) / benchmark["duration"])
            elif strategy["type_"] == "constant":
                assert level.level == strategy["rate"]
            else:
                assert level.level == strategy["streams"]


def _check_aiperf(levels: list[Level]) -> None:
    for level in levels:
        data = json.loads((level.path / "profile_export_aiperf.json").read_text())
        ok = _ok(level)
        assert level.level == data["input_config"]["phases"][0]["concurrency"]
        assert len(ok) == data["request_count"]["avg"]
        assert _close(ok["ttft"].mean() * 1000, data["time_to_first_token"]["avg"])
        assert _close(ok["e2e"].mean() * 1000, data["request_latency"]["avg"])
        # the figures count the server's usage; AIPerf's own counts are kept beside them
        assert ok["output_tokens"].sum() == data["total_usage_completion_tokens"]["avg"]
        assert ok[CLIENT_OUTPUT_TOKENS].sum() == data["output_sequence_length"]["sum"]
        assert _close(float(np.mean(np.concatenate(ok["itl"].to_list()))) * 1000,
                      data["inter_chunk_latency"]["avg"])


def _check_inference_perf(levels: list[Level]) -> None:
    for level in levels:
        report = json.loads(level.path.read_text())
        ok = _ok(level)
        latency = report["successes"]["latency"]
        assert level.level == report["load_summary"]["concurrency"]
        assert len(level.requests) == report["load_summary"]["count"]
        assert len(ok) == report["successes"]["count"]
        assert _close(ok["ttft"].mean(), latency["time_to_first_token"]["mean"])
        assert _close(ok["e2e"].mean(), latency["request_latency"]["mean"])
    # the tool's tokenizer counted other output tokens than the server's usage (the simulator counts
    # words): both are kept, and the figures use the server's
    entries = json.loads((levels[0].path.parent / "per_request_lifecycle_metrics.json").read_text())
    server = sum(e["info"]["response_metrics"]["server_usage"]["completion_tokens"] for e in entries)
    client = sum(e["info"]["response_metrics"]["output_tokens"] for e in entries)
    mine = [lv for lv in levels if lv.path.parent == levels[0].path.parent]
    assert server != client
    assert sum(int(_ok(lv)["output_tokens"].sum()) for lv in mine) == server
    assert sum(int(_ok(lv)[CLIENT_OUTPUT_TOKENS].sum()) for lv in mine) == client


CHECKS = {"guidellm": _check_guidellm, "aiperf": _check_aiperf, "inference-perf": _check_inference_perf}


@pytest.mark.parametrize("folder", sorted(CAPTURED))
def test_every_captured_fixture_imports_and_agrees_with_the_tools_own_aggregates(folder: str) -> None:
    tool, mode, per_topology = CAPTURED[folder]
    results = read_results([str(PEERS / folder)])
    assert {level.tool for level in results.levels} == {tool}
    assert results.mode is mode and results.warnings == []
    assert sorted({level.topology for level in results.levels}) == TOPOLOGIES
    for topology in TOPOLOGIES:
        assert len([lv for lv in results.levels if lv.topology == topology]) == per_topology
    for level in results.levels:
        assert len(level.requests) == 6 and level.requests["ok"].all()
    CHECKS[results.levels[0].tool_name](results.levels)


# captured against one real vLLM CPU server (the tiny BPE model, devkit/realvllm.py) at
# concurrency 2 and 4: tool -> its name in the results
REAL_VLLM = {"guidellm-0.8.1": "guidellm 0.8.1", "guidellm-0.7.1": "guidellm 0.7.1",
             "aiperf-0.13.0": "aiperf 0.13.0", "inference-perf-0.7.0": "inference-perf"}


@pytest.mark.parametrize("folder", sorted(REAL_VLLM))
def test_every_real_vllm_fixture_imports_and_agrees_with_the_tools_own_aggregates(folder: str) -> None:
    results = read_results([str(PEERS / "real-vllm" / folder)])
    assert {level.tool for level in results.levels} == {REAL_VLLM[folder]}
    assert results.mode is Mode.CLOSED and results.warnings == []
    assert {level.topology for level in results.levels} == {"tp1x1"}  # the folder right under it
    assert sorted(level.level for level in results.levels) == [2.0, 4.0]
    for level in results.levels:
        assert len(level.requests) == 6 and level.requests["ok"].all()
        # the server's usage (max_tokens 16, ignore_eos) is what the figures count; the tool's own
        # count of the same text with the model's tokenizer is kept beside it
        assert (level.requests["output_tokens"] == 16).all()
        assert level.requests[CLIENT_OUTPUT_TOKENS].notna().all()
    CHECKS[results.levels[0].tool_name](results.levels)


def test_real_vllm_token_counts_differ_between_tool_and_server_and_both_are_said(
        capsys: pytest.CaptureFixture[str]) -> None:
    # re-tokenizing a dummy model's random tokens as text does not give them back: AIPerf and
    # inference-perf count more output tokens than the server generated, and analyze says so
    for folder, counted in (("aiperf-0.13.0", "63 input and 23.7 output"),
                            ("inference-perf-0.7.0", "64 input and 34.6 output")):
        assert main(["analyze", str(PEERS / "real-vllm" / folder), "--goodput", "ttft:1000",
                     "--bootstrap", "0"]) == 0
        out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
        assert f"(per request the tool counted {counted} tokens, the figures 64 and 16)" in out, out


def test_aiperf_keeps_a_stream_that_came_in_one_read_as_it_timed_it() -> None:
    # at concurrency 4 the CPU server's 16-token streams reached AIPerf in one read each
    # (http_req_chunks_received 1): its ITLs are 0 and TTFT is the whole request. Imported as the
    # tool timed them, so its aggregates still agree (see _check_aiperf).
    results = read_results([str(PEERS / "real-vllm" / "aiperf-0.13.0" / "tp1x1" / "c4")], ["tp1x1"])
    (level,) = results.levels
    records = [json.loads(line) for line in (level.path / "profile_export.jsonl").read_text().splitlines()]
    assert all(r["metrics"]["http_req_chunks_received"]["value"] == 1 for r in records)
    assert (level.requests["ttft"] == level.requests["e2e"]).all()
    assert all(not any(itls) for itls in level.requests["itl"])


def test_analyze_an_aiperf_folder_gives_the_table_crossover_and_a_run_folder_the_app_opens(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["analyze", str(PEERS / "aiperf-0.13.0"), "--goodput", "ttft:1000", "tpot:100",
                 "--bootstrap", "0", "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "aiperf 0.13.0: 4 level(s) of tp2x2, tp4x1 on the concurrency axis" in out
    # AIPerf's BPE counted other tokens than the simulator's usage (whitespace words): both shown
    assert "(per request the tool counted 63 input and 19 output tokens, the figures 16.1 and 16)" in out
    run = load_run(tmp_path / "run")
    assert sorted(run.summary["topology"].unique()) == TOPOLOGIES
    assert sorted(run.summary["level"].unique()) == [2.0, 4.0]
    assert (run.summary["attainment"] == 1.0).all()


def test_guidellm_sweeps_at_each_topologys_own_rates_cross(capsys: pytest.CaptureFixture[str]) -> None:
    # each run at its achieved rate, no rate shared: compared between each topology's own levels
    assert main(["analyze", str(PEERS / "guidellm-0.8.1" / "sweep"), "--goodput", "ttft:1000",
                 "--bootstrap", "50"]) == 0
    out = capsys.readouterr().out
    assert "guidellm 0.8.1: 6 level(s) of tp2x2, tp4x1 on the rate axis" in out
    assert "note: the topologies were measured at different levels, so the crossings compare them" in out
    assert "fewer than two common levels" not in out
    crossing = re.search(r"tp2x2 overtakes tp4x1 in p99 TPOT at rate about ([\d.]+) \(95% CI [\d.]+-[\d.]+, "
                         r"between levels ([\d.]+) and ([\d.]+)\)", out)
    assert crossing is not None, out
    x, low, high = (float(v) for v in crossing.groups())
    assert low < x < high


def _copy(source: str, target: Path) -> Path:
    shutil.copytree(PEERS / source, target)
    return target


def test_topologies_one_rule_for_every_tool(tmp_path: Path) -> None:
    """runs/ with tp4x1/ and tp2x2/ below names them; so do the two folders given; --topology
    overrides; and a file given alone is named by its folder."""
    runs = _copy("aiperf-0.13.0", tmp_path / "runs")
    by_root = read_results([str(runs)])
    by_folders = read_results([str(runs / "tp4x1"), str(runs / "tp2x2")])
    assert sorted({lv.topology for lv in by_root.levels}) == TOPOLOGIES
    assert sorted({lv.topology for lv in by_folders.levels}) == TOPOLOGIES
    renamed = read_results([str(runs / "tp4x1"), str(runs / "tp2x2")], ["big", "small"])
    assert sorted((lv.topology, lv.path.parent.name) for lv in renamed.levels) == [
        ("big", "tp4x1"), ("big", "tp4x1"), ("small", "tp2x2"), ("small", "tp2x2")]
    alone = read_results([str(runs / "tp4x1")], ["tp4x1"])
    assert {lv.topology for lv in alone.levels} == {"tp4x1"} and len(alone.levels) == 2
    one_file = read_results([str(PEERS / "guidellm-0.8.1" / "concurrent" / "tp2x2" / "benchmarks.json")])
    assert {lv.topology for lv in one_file.levels} == {"tp2x2"}
    jsonl = read_results([str(runs / "tp4x1" / "c2" / "profile_export.jsonl")], ["tp4x1"])
    assert [(lv.tool, lv.level, len(lv.requests)) for lv in jsonl.levels] == [("aiperf 0.13.0", 2.0, 6)]
    # a vllm bench serve file's --metadata topology= wins over its place and the flag
    bench = {"completed": 1, "failed": 0, "duration": 1.0, "request_rate": "inf", "max_concurrency": 8,
             "topology": "tp8x1", "input_lens": [10], "output_lens": [3], "ttfts": [0.1],
             "itls": [[0.01, 0.01]], "start_times": [0.0], "errors": [""]}
    (tmp_path / "bench" / "tp4x1").mkdir(parents=True)
    (tmp_path / "bench" / "tp4x1" / "c8.json").write_text(json.dumps(bench))
    for flag in ([], ["ignored"]):
        named = read_results([str(tmp_path / "bench")], flag)
        assert [(lv.tool, lv.topology) for lv in named.levels] == [("vllm bench serve", "tp8x1")]
    del bench["topology"]  # without it, the rule names it like any tool's
    (tmp_path / "bench" / "tp4x1" / "c8.json").write_text(json.dumps(bench))
    assert [lv.topology for lv in read_results([str(tmp_path / "bench")]).levels] == ["tp4x1"]
    with pytest.raises(UserError, match="--topology: give one name, or one per path"):
        read_results([str(runs / "tp4x1"), str(runs / "tp2x2")], ["a", "b", "c"])


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code = main(["analyze", *argv, "--goodput", "ttft:100"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_unknown_tools_and_unsupported_versions_are_one_line_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unknown = tmp_path / "other.json"
    unknown.write_text(json.dumps({"hello": 1}))
    err = _one_line_error([str(unknown)], capsys)
    assert str(unknown) in err and "not a result file of any tool" in err and "GuideLLM 0.7.x" in err
    old = json.loads((PEERS / "guidellm-0.8.1/concurrent/tp4x1/benchmarks.json").read_text())
    old["metadata"]["guidellm_version"] = "0.4.0"
    (tmp_path / "guidellm.json").write_text(json.dumps(old))
    err = _one_line_error([str(tmp_path / "guidellm.json")], capsys)
    assert "looks like a GuideLLM 0.4.0 benchmarks file" in err and "supported: " in err
    del old["metadata"]  # before 0.7: benchmarks alone
    (tmp_path / "guidellm.json").write_text(json.dumps(old))
    err = _one_line_error([str(tmp_path / "guidellm.json")], capsys)
    assert "a GuideLLM benchmarks file from before 0.7" in err
    runs = _copy("aiperf-0.13.0/tp4x1/c2", tmp_path / "aiperf")
    data = json.loads((runs / "profile_export_aiperf.json").read_text())
    data["aiperf_version"] = "0.9.0"
    (runs / "profile_export_aiperf.json").write_text(json.dumps(data))
    err = _one_line_error([str(runs)], capsys)
    assert "looks like an AIPerf 0.9.0 run" in err and "AIPerf 0.13.x" in err
    (tmp_path / "folder").mkdir()
    unknown.rename(tmp_path / "folder" / "other.json")
    err = _one_line_error([str(tmp_path / "folder")], capsys)
    assert "no result files there (passed over 1 file(s) of no tool it imports: other.json)" in err
    lone = _copy("inference-perf-0.7.0/tp4x1", tmp_path / "inference-perf")
    (lone / "per_request_lifecycle_metrics.json").unlink()
    err = _one_line_error([str(lone)], capsys)
    assert "no per_request_lifecycle_metrics.json beside it" in err


def test_a_cut_jsonl_keeps_its_complete_records_and_says_how_many_lines_were_dropped(tmp_path: Path) -> None:
    folder = _copy("aiperf-0.13.0/tp4x1/c2", tmp_path / "c2")
    jsonl = folder / "profile_export.jsonl"
    lines = jsonl.read_text().splitlines()
    jsonl.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][: len(lines[-1]) // 2])  # killed mid-write
    results = read_results([str(folder)], ["tp4x1"])
    assert len(results.levels[0].requests) == len(lines) - 1
    kept = len(lines) - 1
    assert results.warnings == [f"{jsonl}: 1 incomplete line(s) dropped, {kept} complete request(s) kept"]


def test_an_aggregate_off_its_requests_is_a_warning_naming_both_numbers(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _copy("aiperf-0.13.0/tp4x1/c2", tmp_path / "tp4x1" / "c2")
    run_file = folder / "profile_export_aiperf.json"
    data = json.loads(run_file.read_text())
    recomputed = data["time_to_first_token"]["avg"]
    data["time_to_first_token"]["avg"] = recomputed * 2
    run_file.write_text(json.dumps(data))
    assert main(["analyze", str(tmp_path), "--goodput", "ttft:1000", "--bootstrap", "0"]) == 0
    err = capsys.readouterr().err
    assert f"warning: {run_file}: the tool's mean TTFT (ms) is {recomputed * 2:.6g}, recomputed from its " \
           f"requests {recomputed:.6g}" in err


def test_failures_as_the_tools_recorded_them_count_and_are_never_good() -> None:
    """GuideLLM's `errored` requests and AIPerf's error records, from runs against a topology whose
    simulator answered half the requests with 500 (scripts/capture-peer-fixtures)."""
    from crossover.loadgen.analysis.summary import mark_requests

    guide = read_results([str(PEERS / "failures" / "guidellm-0.8.1")], ["tp4x1"])
    totals = json.loads((PEERS / "failures/guidellm-0.8.1/tp4x1/benchmarks.json").read_text())[
        "benchmarks"][0]["metrics"]["request_totals"]
    aiperf = read_results([str(PEERS / "failures" / "aiperf-0.13.0")], ["tp4x1"])
    run = json.loads((PEERS / "failures/aiperf-0.13.0/tp4x1/c2/profile_export_aiperf.json").read_text())
    assert guide.warnings == [] and aiperf.warnings == []
    for results, failed, served in ((guide, totals["errored"], totals["successful"]),
                                    (aiperf, run["error_request_count"]["avg"], run["request_count"]["avg"])):
        requests = results.levels[0].requests
        assert failed > 0 and (~requests["ok"]).sum() == failed and requests["ok"].sum() == served
        marked = mark_requests(requests, {"ttft": 60_000.0})  # an SLO every served request meets
        assert marked["counted"].sum() == failed + served and marked["good"].sum() == served
    assert set(aiperf.levels[0].requests.loc[~aiperf.levels[0].requests["ok"], "status"]) == {500}


def test_failed_requests_count_as_not_good(tmp_path: Path) -> None:
    """An AIPerf record with an error (its ErrorDetails) fails the request: counted, never good."""
    folder = _copy("aiperf-0.13.0/tp4x1/c2", tmp_path / "c2")
    jsonl = folder / "profile_export.jsonl"
    records = [json.loads(line) for line in jsonl.read_text().splitlines()]
    records[0]["error"] = {"code": 500, "type": "InternalServerError", "message": "engine died"}
    jsonl.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    results = read_results([str(folder)], ["tp4x1"])
    requests = results.levels[0].requests
    assert (~requests["ok"]).sum() == 1 and "engine died" in set(requests["error"])
    from crossover.loadgen.analysis.summary import mark_requests

    marked = mark_requests(requests, {"ttft": 10_000.0})
    assert marked["counted"].sum() == len(records) and marked["good"].sum() == len(records) - 1


def test_mixed_tools_agree_on_topologies_and_axis_or_it_is_a_one_line_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    for topology in TOPOLOGIES:  # GuideLLM at concurrency 2 and 4, AIPerf at 3: fine together
        shutil.copytree(PEERS / "guidellm-0.8.1" / "concurrent" / topology, runs / topology / "guidellm")
        aiperf = shutil.copytree(PEERS / "aiperf-0.13.0" / topology / "c2", runs / topology / "aiperf-c3")
        data = json.loads((aiperf / "profile_export_aiperf.json").read_text())
        data["input_config"]["phases"][0]["concurrency"] = 3
        (aiperf / "profile_export_aiperf.json").write_text(json.dumps(data))
    mixed = read_results([str(runs)])
    assert sorted((lv.topology, lv.level, lv.tool) for lv in mixed.levels if lv.topology == "tp4x1") == [
        ("tp4x1", 2.0, "guidellm 0.8.1"), ("tp4x1", 3.0, "aiperf 0.13.0"), ("tp4x1", 4.0, "guidellm 0.8.1")]
    shutil.rmtree(runs / "tp2x2" / "aiperf-c3")  # AIPerf measured tp4x1 only
    err = _one_line_error([str(runs)], capsys)
    assert "mixed tools measured different topologies" in err and "aiperf: tp4x1" in err
    shutil.rmtree(runs / "tp4x1" / "aiperf-c3")
    shutil.copytree(PEERS / "guidellm-0.7.1" / "sweep" / "tp4x1", runs / "tp4x1" / "sweep")
    err = _one_line_error([str(runs)], capsys)
    assert "the results mix load axes" in err
