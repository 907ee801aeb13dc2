"""Prompts of exact token lengths on any tokenizer: random token ids, chat texts fitted under a BPE
where a word is not a token, JSONL and ShareGPT datasets, and every bad input as one line before
any traffic."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pandas as pd
import pytest

from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.analysis.summary import input_len_off, level_warnings, summarize
from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist, Mode, SweepPlan
from crossover.loadgen.traffic.dataset import prepare_workload, requests
from crossover.loadgen.traffic.tokens import LocalTokenizer, ServerTokenizer, open_tokenizer
from devkit.realvllm import make_tiny_model
from tests.faults.faults_servers import serving
from tests.helpers import SPECS, word_tokenizer
from tests.loadgen.loadgen_fake_server import FakeServer


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> LocalTokenizer:
    """The real-vLLM fixture's tokenizer: byte-level BPE, most words several tokens."""
    return LocalTokenizer(make_tiny_model(tmp_path_factory.mktemp("bpe")))


@pytest.fixture(scope="module")
def words(tmp_path_factory: pytest.TempPathFactory) -> LocalTokenizer:
    return LocalTokenizer(word_tokenizer(tmp_path_factory.mktemp("words")))


def test_a_word_is_not_a_token_in_the_bpe_fixture(bpe: LocalTokenizer) -> None:
    assert len(bpe.encode("platform engineer w123 w7")) > 4
    assert bpe.encode("the model", special=True)[0] == 1  # BOS, as Llama's tokenizer adds it


def test_random_completions_are_token_ids_of_the_planned_length_seeded_per_level(bpe: LocalTokenizer) -> None:
    plan = SweepPlan(levels=(1, 2), input_len=LengthDist.parse("uniform:10-20"),
                     output_len=LengthDist.parse("normal:8,3,2-12"), shared_prefix=5, seed=7)
    workload = prepare_workload(plan, bpe, 2048)
    first = list(itertools.islice(requests(workload, 1), 300))
    assert first[:10] == list(itertools.islice(requests(workload, 1), 10))
    assert [r.index for r in first] == list(range(300))
    assert list(itertools.islice(requests(workload, 2), 10)) != first[:10]
    prefix = first[0].prompt[:5]
    for request in first:
        assert isinstance(request.prompt, list)
        assert len(request.prompt) == request.input_len and 10 <= request.input_len <= 20
        assert request.prompt[:5] == prefix and set(request.prompt) <= set(workload.pool.tolist())
        assert 2 <= request.output_len <= 12
    assert len({r.output_len for r in first}) > 3
    other_seed = prepare_workload(SweepPlan(levels=(1,), seed=8), bpe, 2048)
    assert next(requests(other_seed, 1)).prompt != first[0].prompt


def test_random_chat_texts_are_exact_under_a_bpe_with_the_template_planned(bpe: LocalTokenizer) -> None:
    plan = SweepPlan(levels=(4,), input_len=LengthDist.parse("uniform:20-200"), endpoint=Endpoint.CHAT,
                     shared_prefix=8)
    workload = prepare_workload(plan, bpe, 2048)
    assert workload.template_tokens > 0
    assert workload.describe()["chat_template_tokens"] == workload.template_tokens
    for request in itertools.islice(requests(workload, 4), 40):
        assert isinstance(request.prompt, str) and request.messages is not None
        content = len(bpe.encode(request.prompt))
        assert request.input_len == content + workload.template_tokens
        chat = bpe.encode_chat(request.messages)
        assert chat is not None and len(chat) == request.input_len
        assert len(request.prompt.split()) != content  # words are not tokens here


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_jsonl_and_sharegpt_are_counted_by_the_tokenizer_and_sampled_with_the_seed(
        bpe: LocalTokenizer, tmp_path: Path) -> None:
    jsonl = _write(tmp_path / "d.jsonl", [
        json.dumps({"prompt": "the model serves tokens to the client", "output_len": 5}),
        json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "what is a platform engineer"}]}),
        "",
        json.dumps({"prompt": "each one is streamed back"})])
    plan = SweepPlan(levels=(1,), endpoint=Endpoint.CHAT, dataset=DatasetKind.JSONL, dataset_path=jsonl,
                     output_len=LengthDist.fixed(7))
    workload = prepare_workload(plan, bpe, 2048)
    batch = list(itertools.islice(requests(workload, 1), 6))
    assert batch == list(itertools.islice(requests(workload, 1), 6))  # the same for every topology
    assert {r.prompt for r in batch[:3]} == {"the model serves tokens to the client",
                                             "what is a platform engineer", "each one is streamed back"}
    for request in batch:
        assert request.messages is not None
        assert request.input_len == len(bpe.encode_chat(request.messages) or [])
        assert request.output_len == (5 if str(request.prompt).startswith("the model") else 7)
    sharegpt = tmp_path / "s.json"
    sharegpt.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "the model serves"},
                                      {"from": "gpt", "value": "tokens in steps of a batch"}]},
        {"id": "b", "conversations": [{"from": "system", "value": "short"},
                                      {"from": "human", "value": "hello there"}]}]))
    plan = SweepPlan(levels=(1,), dataset=DatasetKind.SHAREGPT, dataset_path=str(sharegpt),
                     output_len=LengthDist.fixed(3))
    workload = prepare_workload(plan, bpe, 2048)
    by_prompt = {r.prompt: r for r in itertools.islice(requests(workload, 1), 4)}
    assert by_prompt["the model serves"].input_len == len(bpe.encode("the model serves", special=True))
    assert by_prompt["the model serves"].output_len == len(bpe.encode("tokens in steps of a batch"))
    assert by_prompt["hello there"].output_len == 3  # no recorded answer: the plan's length


@pytest.mark.parametrize(("lines", "endpoint", "message"), [
    (['{"prompt": "ok"}', '{"prompt": "broken"'], "chat", "d.jsonl:2: not JSON"),
    (['["a list"]'], "chat", "d.jsonl:1: want a JSON object"),
    (['{"prompt": ""}'], "chat", "d.jsonl:1: want a non-empty prompt"),
    (['{"messages": [{"role": "system", "content": "x"}]}'], "chat", "d.jsonl:1: the conversation has no"),
    (['{"messages": [{"role": "user", "content": "x"}]}'], "completions", "d.jsonl:1: has messages"),
    (['{"prompt": "x", "output_len": 0}'], "chat", "d.jsonl:1: output_len must be a positive integer"),
    (["", "  "], "chat", "holds no prompts"),
])
def test_bad_jsonl_is_one_line_naming_file_and_line(lines: list[str], endpoint: str, message: str,
                                                   bpe: LocalTokenizer, tmp_path: Path) -> None:
    plan = SweepPlan(levels=(1,), endpoint=Endpoint(endpoint), dataset=DatasetKind.JSONL,
                     dataset_path=_write(tmp_path / "d.jsonl", lines))
    with pytest.raises(UserError, match=message) as info:
        prepare_workload(plan, bpe, 2048)
    assert "\n" not in str(info.value)


def test_bad_sharegpt_missing_files_and_too_long_prompts(words: LocalTokenizer, bpe: LocalTokenizer,
                                                         tmp_path: Path) -> None:
    def fails(plan: SweepPlan, message: str, level: float = 1) -> None:
        with pytest.raises(UserError, match=message):
            workload = prepare_workload(plan, words, 64)
            next(requests(workload, level))

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"id": "x", "conversations": [{"from": "gpt", "value": "hi"}]}]))
    fails(SweepPlan(levels=(1,), dataset=DatasetKind.SHAREGPT, dataset_path=str(path)),
          "conversation x: the conversation has no user turn")
    path.write_text('{"not": "a list"}')
    fails(SweepPlan(levels=(1,), dataset=DatasetKind.SHAREGPT, dataset_path=str(path)), "JSON list")
    fails(SweepPlan(levels=(1,), dataset=DatasetKind.JSONL, dataset_path=str(tmp_path / "none.jsonl")),
          "none.jsonl: cannot read it")
    fails(SweepPlan(levels=(1,), input_len=LengthDist.fixed(60), output_len=LengthDist.fixed(8)),
          "more than the model's context of 64")
    with pytest.raises(UserError, match="over 3 turns reaches"):
        three_turns = SweepPlan(levels=(1,), input_len=LengthDist.fixed(400),
                                output_len=LengthDist.fixed(400), turns=3, endpoint=Endpoint.CHAT)
        prepare_workload(three_turns, bpe, 4096)  # the tokenizer's own config says 2,048
    long = _write(tmp_path / "long.jsonl", [json.dumps({"prompt": "the " * 70})])
    fails(SweepPlan(levels=(1,), dataset=DatasetKind.JSONL, dataset_path=long),
          "long.jsonl:1: a prompt of 70")


def test_tokenizer_sources_that_do_not_work_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"no tokenizer\.json there"):
        LocalTokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(UserError, match=r"tokenizer\.json does not load"):
        LocalTokenizer(tmp_path)
    with serving({}) as server, pytest.raises(UserError, match="has no /tokenize endpoint") as info:
        open_tokenizer(None, [server.url], "m")
    assert "--tokenizer" in str(info.value) and "\n" not in str(info.value)
    chatless = LocalTokenizer(word_tokenizer(tmp_path / "w"))
    with pytest.raises(UserError, match="no chat template"):
        prepare_workload(SweepPlan(levels=(1,), endpoint=Endpoint.CHAT), chatless, 2048)


def test_server_tokenizer_agrees_with_the_local_one_on_the_fake_server(words: LocalTokenizer) -> None:
    with FakeServer() as server:
        remote = ServerTokenizer(server.url, "m")
        text = "the model w5 serves"
        assert len(remote.encode(text)) == len(words.encode(text)) == 4
        assert remote.decode(remote.encode("w1 w2")) == "w1 w2"
        remote.close()


def test_a_level_whose_server_counted_other_lengths_is_flagged() -> None:
    assert not input_len_off(128, 129) and not input_len_off(1000, 1009)
    assert input_len_off(128, 131) and input_len_off(1000, 1011)
    rows = []
    for counted, level in ((128, 1.0), (500, 2.0)):
        rows.append({"topology": "a", "level": level, "index": 0, "instance": "u", "send_time": 0.0,
                     "end_time": 1.0, "ok": True, "status": 200, "error": "", "ttft": 0.1, "e2e": 1.0,
                     "tpot": 0.1, "itl": [0.1], "itl_max": 0.1, "chunk_times": [], "chunk_tokens": [],
                     "input_tokens": counted, "output_tokens": 2, "planned_input": 128, "planned_output": 2,
                     "completion_id": "", "garbage": 0})
    summary = summarize(pd.DataFrame(rows), {"ttft": 1000.0}, {"a": 1},
                        SweepPlan(mode=Mode.CLOSED, levels=(1, 2)))
    assert summary["input_len_off"].tolist() == [False, True]
    assert level_warnings(summary) == [
        "a at 2: the server counted 500.0 input tokens per request, 128.0 planned (the prompts were not the "
        "asked length)"]


def test_cli_bad_workload_inputs_exit_2_in_one_line_before_any_traffic(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from crossover.spec import load_spec, parse_spec

    data = load_spec(SPECS / "cpu-real-vllm.yaml").model_dump(mode="json")
    with FakeServer() as server:
        data["topologies"] = [t for t in data["topologies"] if t["name"] == "big1x2c"]
        data["topologies"][0]["instances"][0]["url"] = server.url
        spec_path = tmp_path / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(parse_spec(data).model_dump(mode="json")))
        out = tmp_path / "run"
        base = ["sweep", str(spec_path), "--out", str(out), "--concurrency", "1", "--rounds", "1",
                "--input-len", "4", "--output-len", "2", "--bootstrap", "0"]
        assert main(base) == 0
        finished = sorted(p.name for p in (out / "levels").rglob("*.parquet"))
        sent = len(server.bodies)
        capsys.readouterr()
        bad = _write(tmp_path / "bad.jsonl", ['{"prompt": "x"}', "{oops"])
        lines = ['{"prompt": "x"}'] * 20 + [json.dumps({"prompt": "w " * 5000})]
        long = _write(tmp_path / "long.jsonl", lines)
        cases = [  # the long prompt is sampled only at the second level: still before any traffic
            (["--dataset-name", "jsonl", "--dataset-path", long, "--concurrency", "1,2", "--requests", "21"],
             "long.jsonl:21: a prompt of 5000 tokens"),
            (["--dataset-name", "jsonl", "--dataset-path", bad], "bad.jsonl:2: not JSON"),
            (["--dataset-path", str(tmp_path / "missing.jsonl")], "missing.jsonl: cannot read it"),
            (["--tokenizer", str(tmp_path)], "no tokenizer.json there"),
            (["--random-input-len", "5000"], "more than the model's context"),
            (["--dataset-name", "sharegpt"], "give the file with --dataset-path"),
            (["--endpoint", "chat", "--tokenizer", word_tokenizer(tmp_path / "w")], "no chat template"),
        ]
        for extra, message in cases:
            code = main([*base, *extra])
            err = capsys.readouterr().err
            assert code == 2 and message in err and err.count("\n") == 1, (extra, err)
        assert len(server.bodies) == sent  # no traffic
    assert sorted(p.name for p in (out / "levels").rglob("*.parquet")) == finished  # nothing lost


def test_the_simulator_counts_what_its_tokenize_says_and_sweeps_get_planned_lengths(tmp_path: Path) -> None:
    from crossover.loadgen.sweep import run_sweep
    from crossover.netutil import spec_on_free_ports
    from crossover.sim.fleet import running_fleet
    from crossover.spec import load_spec
    from tests.sim.sim_client import post_json, stream

    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    url = spec.topologies[0].instances[0].url
    model = spec.model.name
    with running_fleet(spec):
        chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the model w7 serves"}]
        for field, prompt, path in (("prompt", "the model w7 serves", "/v1/completions"),
                                    ("prompt", [5, 6, 7], "/v1/completions"),
                                    ("messages", chat, "/v1/chat/completions")):
            status, counted = post_json(url + "/tokenize", {"model": model, field: prompt})
            assert status == 200 and counted["count"] == len(counted["tokens"])
            events = stream(url + path, {"model": model, field: prompt, "max_tokens": 2,
                                         "stream_options": {"include_usage": True}})
            assert events[-1]["usage"]["prompt_tokens"] == counted["count"], (field, prompt)
        status, text = post_json(url + "/detokenize", {"model": model, "tokens": counted["tokens"][4:7]})
        assert status == 200 and post_json(url + "/tokenize", {"prompt": text["prompt"]})[1]["count"] == 3
        assert post_json(url + "/tokenize", {"model": "other", "prompt": "x"})[0] == 400
        for endpoint in (Endpoint.COMPLETIONS, Endpoint.CHAT):
            plan = SweepPlan(levels=(2,), requests_per_level=4, input_len=LengthDist.parse("uniform:30-90"),
                             output_len=LengthDist.fixed(4), endpoint=endpoint)
            result = run_sweep(spec, plan, tmp_path / endpoint.value, ["tp4x1"], n_boot=0)
            requests = result.requests
            assert requests["ok"].all(), requests["error"].unique()
            assert (requests["input_tokens"] == requests["planned_input"]).all()
            overhead = 4 if endpoint is Endpoint.CHAT else 0
            assert result.workload["chat_template_tokens"] == overhead
            assert requests["planned_input"].between(30 + overhead, 90 + overhead).all()
            assert json.loads((tmp_path / endpoint.value / "workload.json").read_text())["tokenizer"] == \
                url + "/tokenize"


def test_multi_turn_conversations_on_the_simulator(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each turn sends the history, the previous answer and a new message: the simulator counts
    exactly the planned input of every turn, later turns are longer, and TTFT per turn is reported."""
    import yaml

    from crossover.loadgen.analysis.results import load_run
    from crossover.netutil import spec_on_free_ports
    from crossover.sim.fleet import running_fleet
    from crossover.spec import load_spec

    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    with running_fleet(spec):
        code = main(["sweep", str(spec_path), "--out", str(tmp_path / "run"), "--topology", "tp2x2",
                     "--concurrency", "2", "--num-prompts", "12", "--endpoint", "chat", "--turns", "3",
                     "--think-time", "0.05", "--input-len", "20", "--output-len", "5", "--bootstrap", "0"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "per turn" in captured.out
    run = load_run(tmp_path / "run")
    requests = run.requests
    assert len(requests) == 12 and requests["ok"].all() and sorted(requests["turn"].unique()) == [1, 2, 3]
    assert (requests["input_tokens"] == requests["planned_input"]).all()
    by_turn = requests.groupby("turn")["input_tokens"].mean()
    assert by_turn[1] == 24 and by_turn[2] == 24 + 5 + 20 + 8 and by_turn[3] == by_turn[2] + 33
    # one conversation's turns went to one instance, in order, the think time apart
    for _, conversation in requests.groupby(requests["index"] // 3):
        assert conversation["instance"].nunique() == 1
        sends = conversation.sort_values("turn")
        assert (sends["send_time"].diff().dropna() >= 0.05).all()
    assert list(run.turns["turn"]) == [1, 2, 3] and run.turns["ttft_p99_ms"].notna().all()
    assert (tmp_path / "run" / "turns.csv").exists()
    with pytest.raises(UserError, match="--endpoint chat"):
        SweepPlan(levels=(1,), turns=2)
    # open loop: conversations arrive at the rate divided by their turns; 5 requests make 3 of 2 turns
    from crossover.loadgen.sweep import run_sweep

    plan = SweepPlan(mode=Mode.OPEN, levels=(20.0,), requests_per_level=5, endpoint=Endpoint.CHAT, turns=2,
                     input_len=LengthDist.fixed(10), output_len=LengthDist.fixed(3))
    with running_fleet(spec):
        result = run_sweep(spec, plan, tmp_path / "open", ["tp4x1"], n_boot=0)
    assert sorted(result.requests["turn"]) == [1, 1, 1, 2, 2, 2] and result.requests["ok"].all()


def test_each_level_keeps_the_servers_view_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from crossover.app.view import past_view, server_table
    from crossover.loadgen.analysis.results import load_run
    from crossover.loadgen.sweep import run_sweep
    from crossover.netutil import spec_on_free_ports
    from crossover.sim.fleet import running_fleet
    from crossover.spec import load_spec

    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    plan = SweepPlan(levels=(1, 4), requests_per_level=8, input_len=LengthDist.fixed(64),
                     output_len=LengthDist.fixed(16))
    with running_fleet(spec):
        run_sweep(spec, plan, tmp_path, ["tp2x2"], n_boot=0)
    view = json.loads((tmp_path / "levels" / "tp2x2" / "c4.server.json").read_text())
    assert view["scrape_errors"] == {} and view["window_s"] > 0
    # the simulator's counters over the level: every token the sweep asked for, on both replicas
    generated = view["figures"]["generation_tokens_per_second"] * view["window_s"]
    assert generated == pytest.approx(8 * 16, rel=0.01)
    read = []
    read_parquet = pd.read_parquet

    def counted(path, *args, **kwargs):
        read.append(Path(path).name)
        return read_parquet(path, *args, **kwargs)

    monkeypatch.setattr(pd, "read_parquet", counted)
    server = load_run(tmp_path).server
    assert sorted(read) == ["c1.parquet", "c4.parquet"]  # each level's requests read once, views and all
    assert list(server["level"]) == [1.0, 4.0] and (server["server_ttft_p99_ms"] > 0).all()
    assert server_table(past_view(load_run(tmp_path)))["server_output_tps"].gt(0).all()


def test_sharegpt_conversations_play_their_own_later_turns(tmp_path: Path) -> None:
    from crossover.loadgen.sweep import run_sweep
    from crossover.netutil import spec_on_free_ports
    from crossover.sim.fleet import running_fleet
    from crossover.spec import load_spec

    path = tmp_path / "conversations.json"
    path.write_text(json.dumps([{"id": str(n), "conversations": [
        {"from": "human", "value": f"first question {n}"},
        {"from": "gpt", "value": "an answer of six words here"},
        {"from": "human", "value": f"second question number {n}"}, {"from": "gpt", "value": "short one"},
        {"from": "human", "value": "third"}, {"from": "gpt", "value": "a b c"}]} for n in range(3)]))
    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    plan = SweepPlan(levels=(1,), requests_per_level=6, endpoint=Endpoint.CHAT, dataset=DatasetKind.SHAREGPT,
                     dataset_path=str(path), turns=3)
    with running_fleet(spec):
        result = run_sweep(spec, plan, tmp_path / "run", ["tp4x1"], n_boot=0)
    requests = result.requests.sort_values("index")
    assert requests["ok"].all() and list(requests["turn"]) == [1, 2, 3, 1, 2, 3]
    assert list(requests["planned_output"]) == [6, 2, 3, 6, 2, 3]  # each recorded answer's length
    assert (requests["input_tokens"] == requests["planned_input"]).all()


def test_server_views_are_found_from_the_requests_in_hand(tmp_path: Path) -> None:
    """Each finished (topology, level, repeat) of the requests read its LEVEL.server.json, in file-name
    order as the folder lists them; no level file is read again (here there is none), and a view
    whose level the requests lack (not finished) is left out."""
    from crossover.loadgen.analysis.results import SERVER_SUFFIX, level_path, read_server_views, write_json

    plan = SweepPlan(levels=(2, 16), requests_per_level=1)
    for topology, level, repeat, tps in (("a", 16.0, 1, 3.0), ("a", 2.0, 1, 1.0), ("a", 2.0, 2, 2.0),
                                         ("b", 2.0, 1, 9.0)):
        write_json(level_path(tmp_path, plan, topology, level, repeat).with_suffix(SERVER_SUFFIX),
                   {"figures": {"generation_tokens_per_second": tps}})
    requests = pd.DataFrame({"topology": ["a", "a", "a", "a", "c"], "level": [2.0, 2.0, 16.0, 2.0, 2.0],
                             "repeat": [1, 1, 1, 2, 1]})
    server = read_server_views(tmp_path, plan, requests)
    assert list(zip(server["topology"], server["level"], server["server_output_tps"], strict=True)) == [
        ("a", 16.0, 3.0), ("a", 2.0, 2.0), ("a", 2.0, 1.0)]
    assert read_server_views(tmp_path, plan, pd.DataFrame()).empty
