"""`crossover capacity --workload FILE`: the sweep's dataset formats as the ground truth's lengths."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from crossover.capacity import cli
from crossover.capacity.evaluate import Workload, measure
from crossover.capacity.workload_file import dataset_kind, read_lengths
from crossover.cli import main
from crossover.errors import UserError
from crossover.loadgen.plan import DatasetKind, Endpoint, Mode
from crossover.sim import truth
from crossover.sim.tokenizer import MESSAGE_OVERHEAD
from crossover.spec import load_spec
from tests.helpers import SPECS

SEED = SPECS / "seed-70b-h100.yaml"


def _words(n: int) -> str:
    return " ".join(f"w{100 + i % 500}" for i in range(n))


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_jsonl_lengths_are_the_simulators_token_counts(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "w.jsonl", [{"prompt": _words(30), "output_len": 7}, {"prompt": _words(12)}])
    lengths = read_lengths(path, dataset_kind(path, None), Endpoint.COMPLETIONS, 99, 4096)
    # One word, one token (sim/tokenizer.py); the line without output_len gets --output-len.
    assert sorted(lengths) == [(12, 99), (30, 7)]


def test_sharegpt_counts_the_chat_template_and_the_recorded_answer(tmp_path: Path) -> None:
    path = tmp_path / "share.json"
    turns = [{"from": "human", "value": _words(20)}, {"from": "gpt", "value": _words(9)}]
    path.write_text(json.dumps([{"id": "a", "conversations": turns}]))
    assert dataset_kind(path, None) is DatasetKind.SHAREGPT
    lengths = read_lengths(path, DatasetKind.SHAREGPT, Endpoint.CHAT, 99, 4096)
    assert lengths == ((20 + MESSAGE_OVERHEAD, 9),)


def test_a_bad_line_is_the_loaders_error_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "w1 w2"}) + "\n{not json\n")
    assert main(["capacity", str(SEED), "--rate", "1", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not JSON" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("w.txt", "{}", "name its format with --dataset-name"),
        ("long.jsonl", json.dumps({"prompt": _words(8000), "output_len": 500}), "exceeds the model's"),
    ],
)
def test_bad_files_are_one_line(
    tmp_path: Path, name: str, text: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    path.write_text(text + "\n")
    assert main(["capacity", str(SEED), "--rate", "1", "--workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(path) in err and err.count("\n") == 1


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(SEED), "--rate", "1", "--workload", str(tmp_path / "none.jsonl")]) == 2
    assert "--workload" in capsys.readouterr().err


def test_the_ground_truth_runs_the_files_lengths() -> None:
    spec = load_spec(SEED)
    topology = spec.topologies[0]
    pairs = ((64, 8), (3000, 200))
    seen: list[tuple[int, int]] = []
    workload = Workload(Mode.CLOSED, 1532, 104, 40, lengths=pairs)
    rng = random.Random(0)

    def draw() -> tuple[int, int]:
        seen.append(workload.draw(rng))
        return seen[-1]

    run = truth.closed_loop_run(spec, topology, 4, 1532, 104, measured=40, draw=draw)
    assert {(t.prompt_tokens, t.output_tokens) for t in run.traces} == set(pairs)
    assert set(seen) == set(pairs)
    # Open loop: long prompts from the file take longer to a first token than the fixed short ones.
    fixed = measure(spec, topology, Workload(Mode.OPEN, 64, 8, 60), 1.0, {"ttft": 2500})
    filed = measure(spec, topology, Workload(Mode.OPEN, 64, 8, 60, lengths=((3000, 8),)), 1.0, {"ttft": 2500})
    assert filed.ttft_p99_ms > 2 * fixed.ttft_p99_ms


@pytest.mark.slow
def test_the_command_says_the_files_distribution_and_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _jsonl(tmp_path / "w.jsonl", [{"prompt": _words(n), "output_len": 32} for n in (100, 400, 1600)])
    out = tmp_path / "out"
    argv = [str(SEED), "--concurrency", "8", "--layouts", "spec", "--tp", "4", "--requests", "40"]
    assert main(["capacity", *argv, "--workers", "1", "--workload", str(path), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert f"workload: {path}: 3 entries" in text and "prompt tokens mean 700" in text
    saved = json.loads((out / "capacity.json").read_text())["workload"]
    assert saved["entries"] == 3 and saved["source"] == str(path) and saved["input_len"] == 700
    with pytest.raises(UserError, match="--dataset-name: random"):
        read_lengths(path, DatasetKind.RANDOM, Endpoint.COMPLETIONS, 1, 4096)
    assert cli.parse_loads("8", "--concurrency", Mode.CLOSED) == (8.0,)
