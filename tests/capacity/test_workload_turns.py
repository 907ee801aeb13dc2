"""`crossover capacity --workload FILE` with multi-turn conversations (issue #32): a ShareGPT file's
turns read through the sweep's loader, sent as sessions on the ground truth, their history found in
the prefix cache."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from crossover.capacity.evaluate import Workload, find_capacity, first_guess, measure
from crossover.capacity.workload_file import read_conversations
from crossover.cli import main
from crossover.loadgen.plan import DatasetKind, Endpoint, Mode
from crossover.sim import truth
from crossover.sim.scheduler import chained_block_hashes
from crossover.sim.server import answer_text, prompt_keys
from crossover.sim.tokenizer import MESSAGE_OVERHEAD
from crossover.spec import load_spec
from tests.helpers import FIXTURES, SPECS

SEED = SPECS / "seed-70b-h100.yaml"
TURNS = FIXTURES / "workloads" / "sharegpt-turns.json"  # 8 conversations of 2-4 turns


def _fixture() -> list[list[dict[str, str]]]:
    return [item["conversations"] for item in json.loads(TURNS.read_text())]


def _read(endpoint: Endpoint = Endpoint.CHAT, path: Path = TURNS) -> tuple[truth.Conversation, ...]:
    return read_conversations(path, DatasetKind.SHAREGPT, endpoint, 99, 8192).conversations


def test_sharegpt_conversations_keep_every_turn_counted_as_the_sweep_plans_them() -> None:
    read = read_conversations(TURNS, DatasetKind.SHAREGPT, Endpoint.CHAT, 99, 8192)
    assert read.turns == 4
    # Turn k's prompt: every earlier message and recorded answer and the new message, each with the
    # simulator's template tokens (one word, one token): what the live simulator counts.
    expected = []
    for turns in _fixture():
        words = [len(m["value"].split()) for m in turns]
        prompts, outputs, history = [], [], 0
        for k in range(0, len(words), 2):
            history += words[k] + MESSAGE_OVERHEAD
            prompts.append(history)
            outputs.append(words[k + 1])
            history += words[k + 1] + MESSAGE_OVERHEAD
        expected.append(list(zip(prompts, outputs, strict=True)))
    got = [[(t.prompt_tokens, t.output_tokens) for t in talk] for talk in read.conversations]
    assert sorted(got) == sorted(expected)
    assert sorted(len(c) for c in read.conversations) == [2, 2, 2, 3, 3, 3, 4, 4]


def test_a_turns_block_hashes_are_the_live_simulators_over_the_history() -> None:
    """The hashes of turn k are sim/server.py prompt_keys over the messages the sweep sends then: the
    earlier user messages, the simulator's own answers (as streamed) and the new message."""
    talk = max(_read(), key=len)
    source = next(t for t in _fixture() if len(t) == 2 * len(talk)
                  and len(t[0]["value"].split()) + MESSAGE_OVERHEAD == talk[0].prompt_tokens)
    messages: list[dict[str, str]] = []
    for k, turn in enumerate(talk):
        messages.append({"role": "user", "content": source[2 * k]["value"]})
        live = chained_block_hashes(prompt_keys({"messages": messages}, chat=True), 16)
        assert turn.block_hashes == live
        messages.append({"role": "assistant", "content": answer_text(turn.output_tokens)})
        if k:  # the earlier turn's full blocks lead this one's: the history is in the cache
            before = talk[k - 1].block_hashes
            assert turn.block_hashes[: len(before)] == before and len(turn.block_hashes) > len(before)


def test_completions_and_jsonl_messages_are_single_requests(tmp_path: Path) -> None:
    assert all(len(c) == 1 for c in _read(Endpoint.COMPLETIONS))
    # A JSONL line's messages are one request, as the sweep sends them (it has no JSONL turns).
    path = tmp_path / "m.jsonl"
    messages = [{"role": r, "content": f"{r} says w1 w2 w3"} for r in ("user", "assistant", "user")]
    path.write_text(json.dumps({"messages": messages, "output_len": 5}) + "\n")
    read = read_conversations(path, DatasetKind.JSONL, Endpoint.CHAT, 99, 8192)
    assert read.turns == 1 and [len(c) for c in read.conversations] == [1]


def test_sessions_send_each_turn_after_the_last_answer_and_think_time() -> None:
    spec = load_spec(SEED)
    des = truth.FleetDES(spec, spec.topologies[0])
    talks = _read()
    think = 0.75
    sessions = [des.converse(talk, 0.2 * i, think) for i, talk in enumerate(talks)]
    total = sum(len(s) for s in sessions)
    done = [0]

    def on_done(trace: truth.RequestTrace, now: float) -> None:
        done[0] += 1

    des.on_done = on_done
    des.run(lambda: done[0] >= total)
    for session in sessions:
        for earlier, later in itertools.pairwise(session):
            assert earlier.finish is not None and later.arrival == pytest.approx(earlier.finish + think)
            assert later.first_token is not None and later.first_token > later.arrival
            # the history (the earlier turn's prompt blocks) is found in the instance's prefix cache
            assert later.cached_tokens >= 16 * (len(earlier.block_hashes) - 1) > 0
        assert session[0].cached_tokens == 0


def test_a_closed_loop_client_runs_one_conversation_after_another() -> None:
    spec = load_spec(SEED)
    talks = _read()
    workload = Workload(Mode.CLOSED, 800, 80, 40, conversations=talks, turns=4, think_time_s=0.5)
    rng = random.Random(5)
    run = truth.closed_loop_run(spec, spec.topologies[0], 1, 800, 80, measured=40,
                                draw=lambda: workload.draw(rng), think_time_s=0.5)
    gaps = [b.arrival - a.finish for a, b in itertools.pairwise(run.traces) if a.finish]
    # one client: the next turn 0.5 s after an answer, the next conversation at once
    assert all(g == pytest.approx(0.5) or g == pytest.approx(0.0) for g in gaps)
    assert any(g == pytest.approx(0.5) for g in gaps) and any(g == pytest.approx(0.0) for g in gaps)
    # a later turn finds its history (a first turn only when its conversation was drawn before)
    assert all(b.cached_tokens > 0 for a, b in itertools.pairwise(run.traces)
               if b.arrival - (a.finish or 0.0) > 0.25)
    # the capacity search's closed loop: later turns' histories are most of the prompt tokens
    point = measure(spec, spec.topologies[0], workload, 4, {"ttft": 2500.0})
    assert point.counted >= 40 and point.prefix_hit_share > 0.3


def _long(turns: int, words: int, answer: int, name: str = "") -> list[dict[str, str]]:
    out = []
    for k in range(turns):
        out += [{"from": "human", "value": name + " ".join(f"m{k}w{i}" for i in range(words))},
                {"from": "gpt", "value": " ".join(f"a{k}w{i}" for i in range(answer))}]
    return out


def test_long_histories_predict_lower_capacity_in_requests_than_first_turns(tmp_path: Path) -> None:
    """A conversation's later turns carry its history: however much of it the cache holds, every
    decode step reads it, so the fleet holds fewer requests/s of them than of their first turns."""
    path = tmp_path / "long.json"
    path.write_text(json.dumps([{"id": f"c{i}", "conversations": _long(4, 1200, 200, f"c{i} ")}
                                for i in range(12)]))
    talks = _read(path=path)
    assert [len(c) for c in talks] == [4] * 12
    firsts = tuple((talk[0],) for talk in talks)
    spec = load_spec(SEED)
    topology = spec.topology("tp4x1")
    slos = {"ttft": 2000.0, "tpot": 60.0}

    def capacity_rps(conversations: tuple[truth.Conversation, ...]) -> float:
        workload = Workload(Mode.OPEN, 2000, 200, 60, min_span_s=10, conversations=conversations)
        found = find_capacity(lambda load: measure(spec, topology, workload, load, slos), 0.9, Mode.OPEN,
                              first_guess(spec, topology, workload), tolerance=0.1)
        assert found.load is not None and not found.censored
        return found.load * workload.mean_turns  # conversations/s to requests/s

    whole, first = capacity_rps(talks), capacity_rps(firsts)
    assert whole < 0.8 * first


def test_a_bad_conversation_names_file_and_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = json.loads(TURNS.read_text())
    bad[2]["conversations"][3]["from"] = "robot"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    argv = ["capacity", str(SEED), "--rate", "1", "--endpoint", "chat", "--workload"]
    assert main([*argv, str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: conversation conv2: message 3 needs a role" in err and err.count("\n") == 1
    # a later turn past the context: its conversation and turn
    long = tmp_path / "long.json"
    long.write_text(json.dumps([{"id": "big", "conversations": _long(3, 3000, 100)}]))
    assert main([*argv, str(long), "--think-time", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{long}: conversation big: turn 3 reaches" in err and err.count("\n") == 1
    assert main([*argv, str(TURNS), "--think-time", "-1"]) == 2
    assert "--think-time" in capsys.readouterr().err
    assert main([*argv, str(TURNS), "--turns", "0"]) == 2
    assert "--turns: must be at least 1" in capsys.readouterr().err


def test_turns_keeps_a_conversations_first_turns() -> None:
    """--turns N, as the sweep's: a long conversation's first N turns (its later ones may not fit)."""
    whole = _read()
    read = read_conversations(TURNS, DatasetKind.SHAREGPT, Endpoint.CHAT, 99, 8192, max_turns=2)
    assert read.turns == 2 and sorted(len(c) for c in read.conversations) == [2] * 8
    assert {c[:2] for c in whole} == set(read.conversations)


@pytest.mark.slow
def test_the_command_on_conversations_says_turns_rate_and_cache(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = [str(SEED), "--rate", "0.5", "--layouts", "spec", "--requests", "60", "--span", "10",
            "--workers", "1", "--endpoint", "chat", "--think-time", "2", "--workload", str(TURNS)]
    assert main(["capacity", *argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "capacity (conv/s)" in text and "8 conversations of 23 turns" in text
    assert "turns per conversation mean 2.9, p50 3, p99 4" in text and "think time 2 s" in text
    assert "rate: conversations/s (one conversation is 2.88 requests on average" in text
    assert "of prompt tokens predicted cached" in text
    saved = json.loads((out / "capacity.json").read_text())
    workload = saved["workload"]
    assert workload["conversations"] == 8 and workload["turns"] == 4 and workload["think_time_s"] == 2
    assert workload["turns_per_conversation"] == {"mean": 2.875, "p50": 3.0, "p99": 4.0}
    assert workload["load_unit"] == "conv/s" and workload["requests_per_conversation"] == 2.875
    assert 0.2 < workload["prefix_hit_share"] < 1
    assert (out / "spec-top.yaml").is_file() and list(out.glob("spec-tp*.yaml"))


@pytest.mark.slow
def test_validate_sends_the_conversations_with_their_turns(tmp_path: Path) -> None:
    """--validate on a multi-turn file: the live sweep sends every turn (--turns, --think-time) of
    the same conversations, so the live simulator's prefix cache sees the history too, and its
    capacity comes back in conversations/s."""
    from crossover.capacity import cli, validate
    from crossover.loadgen.analysis.results import TURNS_CSV
    from tests.capacity.test_workload_file import cli_args

    # two turns of each conversation and short think times: a live level lasts about a conversation's
    # life twice over (warm-up and drain), and four levels of full 4-turn conversations took 146 s
    argv = [str(SEED), "--rate", "1", "--workload", str(TURNS), "--endpoint", "chat", "--think-time", "0.2",
            "--turns", "2", "--tpot-ms", "8", "--requests", "30", "--span", "4", "--layouts", "colocated",
            "--tp", "4", "--workers", "1"]
    plan, spec = cli.plan(cli_args(*argv))
    result = plan.results[0]
    assert result.capacity.load is not None
    check = validate.check_layout(plan, spec, result, tmp_path / "live")
    assert check.layout == "TP=4x1" and check.measured_capacity is not None
    # the sweep's levels are requests/s (conversations at level / turns): ours x 2, and back (it read
    # 1.07x the prediction; a turn count left out or applied twice reads about 2x or 0.5x)
    assert 0.6 * result.capacity.load < check.measured_capacity < 1.5 * result.capacity.load
    described = json.loads(next((tmp_path / "live").rglob("workload.json")).read_text())
    assert described["dataset"] == "sharegpt" and described["turns"] == 2 and described["endpoint"] == "chat"
    turns = next((tmp_path / "live").rglob(TURNS_CSV)).read_text()
    assert turns.count("\n") > 4  # per-turn rows: later turns were sent
