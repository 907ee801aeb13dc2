"""The OpenAI-compatible surface of one simulated instance, and the `crossover sim` command."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest
import yaml

from crossover.cli import main
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS, wait_for
from tests.sim.sim_client import get_json, get_text, post_json, stream

SPEC = load_spec(SPECS / "seed-70b-h100.yaml")


@pytest.fixture(scope="module", params=["thread", "loop"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[SimFleet, FleetSpec, str]]:
    """One instance serving, its streamed tokens written by the emitter thread, then by the loop."""
    spec = spec_on_free_ports(SPEC)
    with running_fleet(spec, emitter=request.param) as fleet:
        yield fleet, spec, spec.topology("tp4x1").instances[0].url


def test_streamed_completion_with_usage(served: tuple[SimFleet, FleetSpec, str]) -> None:
    fleet, spec, url = served
    events = stream(url + "/v1/completions", {
        "model": spec.model.name, "prompt": "one two three", "max_tokens": 5, "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    tokens = [e for e in events if e["choices"]]
    assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 2, 3, 4, 5]
    assert all(e["object"] == "text_completion" and e["model"] == spec.model.name for e in events)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 4 + ["length"]
    assert events[-1]["choices"] == [] and events[-1]["usage"]["prompt_tokens"] == 3
    record = next(r for r in fleet.requests("tp4-0") if r["id"] == tokens[0]["id"])
    assert record["prompt_tokens"] == 3 and record["output_tokens"] == 5
    assert len(record["token_times"]) == 5 and record["token_times"] == sorted(record["token_times"])
    assert record["arrival"] < record["token_times"][0]
    assert any(r["id"] == record["id"] for r in get_json(url + "/admin/requests"))
    assert get_json(url + f"/admin/requests?since={record['arrival']}&limit=1")[-1]["id"] == record["id"] \
        or get_json(url + f"/admin/requests?since={record['arrival']}")[0]["arrival"] >= record["arrival"]
    assert get_json(url + "/admin/requests?since=9e12") == []
    assert get_json(url + "/admin/requests?limit=0") == []


def test_streamed_chat_sends_the_role_first(served: tuple[SimFleet, FleetSpec, str]) -> None:
    _, spec, url = served
    events = stream(url + "/v1/chat/completions", {
        "model": spec.model.name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
        "ignore_eos": True})
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [e["choices"][0]["delta"]["content"] for e in events[1:]]
    assert len(contents) == 3 and all(contents)
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    assert all(e["object"] == "chat.completion.chunk" for e in events)


def test_token_id_prompt_and_non_streamed(served: tuple[SimFleet, FleetSpec, str]) -> None:
    _, spec, url = served
    status, body = post_json(url + "/v1/completions", {
        "model": spec.model.name, "prompt": list(range(40)), "max_tokens": 4, "ignore_eos": True})
    assert status == 200
    assert body["usage"] == {"prompt_tokens": 40, "total_tokens": 44, "completion_tokens": 4,
                             "prompt_tokens_details": None}
    assert len(body["choices"][0]["text"].split()) == 4


def test_output_length_is_drawn_without_ignore_eos(served: tuple[SimFleet, FleetSpec, str]) -> None:
    _, spec, url = served
    lengths, reasons = [], set()
    for _ in range(12):
        status, body = post_json(url + "/v1/completions", {
            "model": spec.model.name, "prompt": "x", "max_tokens": 40, "min_tokens": 3})
        assert status == 200
        lengths.append(body["usage"]["completion_tokens"])
        reasons.add(body["choices"][0]["finish_reason"])
    assert all(3 <= n <= 40 for n in lengths)
    assert len(set(lengths)) > 1  # drawn, not fixed


def test_draws_repeat_with_the_same_seed() -> None:
    def lengths() -> list[int]:
        spec = spec_on_free_ports(SPEC)
        with running_fleet(spec):
            url = spec.topology("tp4x1").instances[0].url
            return [post_json(url + "/v1/completions", {"model": spec.model.name, "prompt": "x",
                                                         "max_tokens": 30})[1]["usage"]["completion_tokens"]
                    for _ in range(5)]
    assert lengths() == lengths()


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"prompt": "x", "model": "other"}, 404, "other"),
    ({"model": None}, 400, "prompt"),
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
    ({"prompt": "x", "max_tokens": 5, "min_tokens": 9}, 400, "min_tokens"),
    ({"prompt": " ".join(["w"] * 9000)}, 400, "context length"),
    ({"prompt": [[1, 2], [3]]}, 400, "prompt"),
    ({"prompt": "x", "n": 2}, 400, "n must be 1"),
])
def test_bad_requests_get_one_line_errors(served: tuple[SimFleet, FleetSpec, str], body: dict[str, object],
                                          status: int, words: str) -> None:
    _, spec, url = served
    if body.get("model", "") is None:
        body = {k: v for k, v in body.items() if k != "model"}
    got, answer = post_json(url + "/v1/completions", {"model": spec.model.name, **body})
    assert got == status and words in answer["message"] and "\n" not in answer["message"]


def test_models_and_health(served: tuple[SimFleet, FleetSpec, str]) -> None:
    _, spec, url = served
    models = get_json(url + "/v1/models")
    assert models["data"][0]["id"] == spec.model.name
    assert models["data"][0]["max_model_len"] == spec.model.max_model_len
    assert get_text(url + "/health") == ""


def test_cli_serves_every_instance_and_stops_on_sigterm(tmp_path) -> None:
    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    process = subprocess.Popen([sys.executable, "-m", "crossover", "sim", str(path), "--seed", "3"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        entry = spec.topology("pd1p1d").entrypoint.url
        assert entry is not None
        urls = [*(i.url for t in spec.topologies for i in t.instances), entry]
        wait_for(lambda: [get_text(url + "/health", timeout=1) for url in urls], 20,
                 "every instance and the entrypoint answering /health", poll=0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    lines = out.strip().splitlines()
    assert len(lines) == 5 and all(line.split()[1].startswith("http://127.0.0.1:") for line in lines)
    assert "Traceback" not in err


def test_cli_errors_are_one_line(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such file" in err
    assert main(["sim", str(SPECS / "seed-70b-h100.yaml"), "--vllm-version", "latest"]) == 2
    assert "--vllm-version" in capsys.readouterr().err
    assert main(["sim", str(SPECS / "seed-70b-h100.yaml"), "--gc", "often"]) == 2
    err = capsys.readouterr().err
    assert "--gc must be a positive integer, freeze or auto" in err and err.count("\n") == 1
    for flag, value in (("--emitter", "threads"), ("--emitter-priority", "high")):
        with pytest.raises(SystemExit) as usage:
            main(["sim", str(SPECS / "seed-70b-h100.yaml"), flag, value])
        err = capsys.readouterr().err
        assert usage.value.code == 2 and flag in err and value in err and err.count("\n") == 1, err
    spec = spec_on_free_ports(SPEC)
    port = int(spec.topology("tp4x1").instances[0].url.rsplit(":", 1)[1])
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        assert main(["sim", str(path)]) == 2
    err = capsys.readouterr().err
    assert "tp4-0" in err and "cannot listen" in err and err.count("\n") == 1


def test_non_loopback_urls_are_refused(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    data = SPEC.model_dump(mode="json")
    data["topologies"][0]["instances"][0]["url"] = "http://10.1.2.3:8100"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["sim", str(path)]) == 2
    assert "loopback" in capsys.readouterr().err
