"""The sweep end to end against real vLLM CPU servers: one instance on both cores vs two
instances on one core each, balanced client-side (compose/specs/cpu-real-vllm.yaml). Their
tokenizer is a byte-level BPE where most words are several tokens, so a prompt of the asked length
is one the sweep counted with the server's own /tokenize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crossover.cli import main
from crossover.loadgen.analysis.report import STOP_REASONS
from crossover.loadgen.analysis.results import load_run
from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep


@pytest.mark.vllm
@pytest.mark.slow
def test_sweep_reports_every_level_on_real_vllm(real_vllm_fleet, tmp_path: Path) -> None:
    spec = real_vllm_fleet.spec
    plan = SweepPlan(levels=(1, 2, 4), rounds=2, input_len=LengthDist.fixed(16),
                     output_len=LengthDist.fixed(8), timeout_s=60)
    result = run_sweep(spec, plan, tmp_path, n_boot=50)
    requests = result.requests
    assert requests["ok"].all(), requests["error"].unique()
    assert (requests["output_tokens"] == 8).all()  # ignore_eos + min_tokens honoured
    assert (requests["input_tokens"] == 16).all()  # the server counted exactly the planned prompt
    assert not result.summary["input_len_off"].any()
    # real vLLM sends continuous usage, so every event's token count is known
    assert all(sum(tokens) == 8 for tokens in requests["chunk_tokens"])
    assert all(len(itl) == 7 for itl in requests["itl"])
    summary = result.summary
    assert sorted(zip(summary["topology"], summary["level"], strict=True)) == [
        (t, lv) for t in ("big1x2c", "small2x1c") for lv in (1.0, 2.0, 4.0)]
    assert (summary["output_tps"] > 0).all() and (summary["failed"] == 0).all()
    small = requests[requests["topology"] == "small2x1c"]
    assert small["instance"].nunique() == 2  # both small replicas served
    run = load_run(tmp_path)
    assert len(run.requests) == len(requests) and run.crossover.sentences


@pytest.mark.vllm
@pytest.mark.slow
def test_chat_and_dataset_sweeps_get_the_planned_lengths_on_real_vllm(real_vllm_fleet,
                                                                    tmp_path: Path) -> None:
    spec = real_vllm_fleet.spec
    chat = SweepPlan(levels=(2,), requests_per_level=6, input_len=LengthDist.parse("uniform:40-120"),
                     output_len=LengthDist.fixed(6), timeout_s=60, endpoint=Endpoint.CHAT)
    result = run_sweep(spec, chat, tmp_path / "chat", ["big1x2c"], n_boot=0)
    requests = result.requests
    assert requests["ok"].all(), requests["error"].unique()
    overhead = result.workload["chat_template_tokens"]
    assert overhead > 0  # the template's role markers, measured once with the server's /tokenize
    assert (requests["input_tokens"] == requests["planned_input"]).all(), \
        requests[["input_tokens", "planned_input"]]
    assert requests["planned_input"].between(40 + overhead, 120 + overhead).all()
    assert (requests["output_tokens"] == 6).all() and all(len(itl) == 5 for itl in requests["itl"])
    # a ShareGPT file on /v1/completions: text prompts, counted with the BOS the server adds
    sharegpt = tmp_path / "sharegpt.json"
    sharegpt.write_text(json.dumps([
        {"id": str(n), "conversations": [{"from": "human", "value": f"platform engineer plans capacity {n} "
                                                                    "for a fleet of replicas"},
                                         {"from": "gpt", "value": "the model serves tokens " * (n + 1)}]}
        for n in range(5)]))
    plan = SweepPlan(levels=(2,), requests_per_level=5, timeout_s=60, dataset=DatasetKind.SHAREGPT,
                     dataset_path=str(sharegpt))
    result = run_sweep(spec, plan, tmp_path / "sharegpt", ["big1x2c"], n_boot=0)
    requests = result.requests
    assert requests["ok"].all(), requests["error"].unique()
    assert (requests["input_tokens"] == requests["planned_input"]).all()
    assert sorted(requests["output_tokens"]) == sorted(requests["planned_output"])
    assert requests["planned_output"].nunique() == 5  # each answer's own length


@pytest.mark.vllm
@pytest.mark.slow
def test_multi_turn_conversations_on_real_vllm(real_vllm_fleet, tmp_path: Path) -> None:
    """Later turns carry the history: the first turn's length is exact; a later turn's history holds
    the answer as text, which a model with random weights may tokenize differently when it reads it
    back, so there the planned input is checked only to grow by at least the new message."""
    spec = real_vllm_fleet.spec
    plan = SweepPlan(levels=(2,), requests_per_level=6, input_len=LengthDist.fixed(30),
                     output_len=LengthDist.fixed(5), timeout_s=60, endpoint=Endpoint.CHAT, turns=3,
                     think_time_s=0.1)
    result = run_sweep(spec, plan, tmp_path, ["small2x1c"], n_boot=0)
    requests = result.requests
    assert requests["ok"].all(), requests["error"].unique()
    assert sorted(requests["turn"]) == [1, 1, 2, 2, 3, 3]
    first = requests[requests["turn"] == 1]
    assert (first["input_tokens"] == first["planned_input"]).all()
    for _, conversation in requests.groupby(requests["index"] // 3):
        ordered = conversation.sort_values("turn")
        assert ordered["instance"].nunique() == 1
        assert (ordered["input_tokens"].diff().dropna() > 30).all()
    assert list(result.turns["turn"]) == [1, 2, 3]


@pytest.mark.vllm
@pytest.mark.slow
def test_a_local_tokenizer_folder_counts_as_the_server_does(real_vllm_fleet, tiny_model_dir: Path,
                                                            tmp_path: Path) -> None:
    """--tokenizer DIR (offline: tokenizer.json and the chat template rendered locally) plans what
    the real server counts, on chat too."""
    from crossover.loadgen.traffic.tokens import LocalTokenizer, ServerTokenizer

    local = LocalTokenizer(tiny_model_dir)
    server = ServerTokenizer(real_vllm_fleet.single_url, real_vllm_fleet.spec.model.name)
    messages = [{"role": "system", "content": "be brief"},
                {"role": "user", "content": "platform engineer w12"}]
    assert local.encode_chat(messages) == server.encode_chat(messages)
    assert local.encode("plans capacity", special=True) == server.encode("plans capacity", special=True)
    server.close()
    plan = SweepPlan(levels=(2,), requests_per_level=4, input_len=LengthDist.fixed(50),
                     output_len=LengthDist.fixed(4), timeout_s=60, endpoint=Endpoint.CHAT,
                     tokenizer=str(tiny_model_dir))
    result = run_sweep(real_vllm_fleet.spec, plan, tmp_path, ["big1x2c"], n_boot=0)
    requests = result.requests
    assert requests["ok"].all() and (requests["input_tokens"] == requests["planned_input"]).all()
    assert result.workload["tokenizer"] == str(tiny_model_dir)


@pytest.mark.vllm
@pytest.mark.slow
def test_an_adaptive_sweep_from_two_workers_on_real_vllm(real_vllm_fleet, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """`crossover sweep --adaptive --workers 2` as a user runs it on a real fleet: the coarse start,
    then levels added until it says why it stopped, within its request budget, each level's
    requests from both workers in one file; run again on the folder, it resumes and sends nothing."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(real_vllm_fleet.spec.model_dump(mode="json")))
    budget, rounds = 160, 2
    command = ["sweep", str(spec_path), "--concurrency", "1,8", "--rounds", str(rounds), "--input-len", "16",
               "--output-len", "8", "--timeout", "60", "--adaptive", "--metric", "output_tps",
               "--narrow", "crossing", "--target-ci", "0.2", "--max-requests", str(budget),
               "--workers", "2", "--bootstrap", "50", "--no-progress", "--out", str(tmp_path / "run")]
    assert main(command) == 0
    out = capsys.readouterr().out
    run = load_run(tmp_path / "run")
    state = run.crossover.adaptive
    assert state is not None
    reason = state.stop_reason
    assert reason in STOP_REASONS and reason != "stopped", state
    assert f"adaptive sweep stopped: {STOP_REASONS[reason]}" in out, out
    assert state.levels[:2] == (1.0, 3.0)  # the low end and the log middle
    assert all(1 <= level <= 8 for level in state.levels)
    requests = run.requests
    assert requests["ok"].all(), requests["error"].unique()
    assert (requests["input_tokens"] == 16).all() and (requests["output_tokens"] == 8).all()
    assert len(requests) == state.requests <= budget
    assert json.loads((tmp_path / "run" / "run.json").read_text())["traffic"]["workers"] == 2
    for _, measured in requests.groupby(["topology", "level", "repeat"]):
        level = int(measured["level"].iloc[0])
        assert sorted(measured["index"]) == list(range(rounds * level))  # both shares, merged
    assert set(requests["level"]) == set(state.levels)
    assert main(command) == 0
    resumed = load_run(tmp_path / "run")
    assert len(resumed.requests) == len(requests)
    assert resumed.crossover.adaptive is not None and resumed.crossover.adaptive.stop_reason == reason
    assert resumed.crossover.sentences == run.crossover.sentences
