"""The exporter's command line, spec reload on SIGHUP, file_sd, bearer auth, gzip and body limits."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from crossover.cli import main
from crossover.exporter.service import Exporter, make_app
from crossover.exporter.state import snapshot_json
from crossover.netutil import free_port, spec_on_free_ports
from crossover.spec import FleetSpec, load_spec
from tests.helpers import FIXTURES, REPO, SPECS, serving_http, wait_for

PAYLOAD = (FIXTURES / "vllm-0.32.0-after-requests.prom").read_bytes()
TOKEN = "s3cret-token-value"


def write_spec(path: Path, spec: FleetSpec, **scrape: Any) -> Path:
    data = spec.model_dump(mode="json")
    data["scrape"].update(scrape)
    path.write_text(yaml.safe_dump(data))
    return path


def test_bad_spec_and_bad_port_are_one_line_errors(tmp_path, capsys):
    assert main(["exporter", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: no such file" in capsys.readouterr().err
    spec = write_spec(tmp_path / "spec.yaml", spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")))
    assert main(["exporter", str(spec), "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "--port must be 1-65535" in err and "Traceback" not in err
    assert main(["exporter", str(spec), "--prometheus-sd", "prometheus:9090"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prometheus-sd: malformed URL 'prometheus:9090'" in err, err


def test_port_in_use_is_a_one_line_error(tmp_path, capsys):
    spec = write_spec(tmp_path / "spec.yaml", spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["exporter", str(spec), "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"crossover exporter: --port {port}: cannot listen on 127.0.0.1:{port}")


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


@pytest.mark.timeout(90)
def test_sighup_reloads_the_spec_and_a_bad_one_keeps_the_old(tmp_path):
    base = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    spec_path = write_spec(tmp_path / "spec.yaml", base, interval="1s", timeout="500ms")
    port = free_port()
    log = (tmp_path / "exporter.log").open("w")
    command = [sys.executable, "-m", "crossover", "exporter", str(spec_path), "--port", str(port)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                               stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        wait_for(lambda: "crossover_target_up" in _get(url), 30, "the exporter serving")
        spec_path.write_text("model: [this is not a spec\n")
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: 'crossover_exporter_spec_reloads_total{result="error"} 1.0' in _get(url), 30,
                 "the failed reload counted")
        assert process.poll() is None
        assert _get(url).count("crossover_target_up{") == 3  # the old spec still runs
        data = base.model_dump(mode="json")
        data["topologies"][1]["instances"].append({"name": "tp2-2", "url": f"http://127.0.0.1:{free_port()}"})
        data["topologies"][1]["gpus"] = 6
        write_spec(spec_path, FleetSpec.model_validate(data), interval="1s", timeout="500ms")
        process.send_signal(signal.SIGHUP)
        wait_for(lambda: 'crossover_exporter_spec_reloads_total{result="ok"} 1.0' in _get(url), 30,
                 "the good reload counted")
        wait_for(lambda: 'instance="tp2-2"' in _get(url), 30, "the new instance tp2-2 exported")
    finally:
        process.terminate()
        process.wait(10)
        log.close()
    text = (tmp_path / "exporter.log").read_text()
    assert "spec reload failed, keeping the running spec" in text
    assert process.returncode in (0, -signal.SIGTERM)


class _AuthHandler(BaseHTTPRequestHandler):
    """Serves the real vLLM payload only with the right bearer token, gzip-compressed when asked."""

    def do_GET(self) -> None:
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.send_error(401)
            return
        body = PAYLOAD
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def auth_server() -> Iterator[str]:
    with serving_http(_AuthHandler) as address:
        yield f"http://{address}"


def _one_instance_spec(url: str, **scrape: Any) -> FleetSpec:
    data = load_spec(SPECS / "cpu-real-vllm.yaml").model_dump(mode="json")
    data["topologies"] = [{"name": "one", "gpus": 1, "tensor_parallel_size": 1,
                           "instances": [{"name": "solo", "url": url}]}]
    data["scrape"].update(scrape)
    return FleetSpec.model_validate(data)


def _cycle(exporter: Exporter) -> Any:
    async def run() -> Any:
        async with aiohttp.ClientSession() as session:
            return await exporter.cycle(session)
    return asyncio.run(run())


def _serve_once(exporter: Exporter, path: str) -> str:
    """GET one path of the exporter's own HTTP app (on a free loopback port)."""
    async def run() -> str:
        runner = aiohttp.web.AppRunner(make_app(exporter))
        await runner.setup()
        port = free_port()
        await aiohttp.web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as r:
                return await r.text()
        finally:
            await runner.cleanup()
    return asyncio.run(run())


def test_bearer_token_gzip_and_the_token_never_shows(auth_server, monkeypatch, caplog):
    monkeypatch.setenv("CROSSOVER_TEST_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    exporter = Exporter(_one_instance_spec(auth_server, bearer_token_env="CROSSOVER_TEST_TOKEN"))
    snapshot = _cycle(exporter)
    target = snapshot.targets[0]
    assert target.up, target.last_error
    assert target.body_bytes == len(PAYLOAD)  # decompressed size: the body came gzip-compressed
    for path in ("/metrics", "/api/v1/snapshot"):
        assert TOKEN not in _serve_once(exporter, path)
    assert TOKEN not in json.dumps(snapshot_json(snapshot))
    monkeypatch.setenv("CROSSOVER_TEST_TOKEN", "wrong")
    snapshot = _cycle(exporter)
    assert not snapshot.targets[0].up and snapshot.targets[0].errors["http_status"] == 1
    monkeypatch.delenv("CROSSOVER_TEST_TOKEN")
    snapshot = _cycle(exporter)
    assert snapshot.targets[0].errors["http_status"] == 2
    assert "CROSSOVER_TEST_TOKEN is not set" in caplog.text
    assert TOKEN not in caplog.text and "wrong" not in caplog.text


def test_body_over_the_limit_is_refused(auth_server, monkeypatch):
    monkeypatch.setenv("CROSSOVER_TEST_TOKEN", TOKEN)
    exporter = Exporter(_one_instance_spec(auth_server, bearer_token_env="CROSSOVER_TEST_TOKEN",
                                           max_body_bytes=10_000))
    snapshot = _cycle(exporter)
    assert not snapshot.targets[0].up and snapshot.targets[0].errors["too_large"] == 1


def test_file_sd_targets_follow_the_file(tmp_path, auth_server, caplog):
    spec = _one_instance_spec(auth_server)
    sd = tmp_path / "sd.json"
    address = auth_server.removeprefix("http://")
    sd.write_text(json.dumps([{"targets": [address], "labels": {"topology": "one", "instance": "extra-0"}}]))
    exporter = Exporter(spec, file_sd_paths=[str(sd)])
    assert sorted(t.instance for t in exporter.targets) == ["extra-0", "solo"]
    sd.write_text(json.dumps([{"targets": [address, "127.0.0.1:1"],
                               "labels": {"topology": "one", "role": "colocated"}}]))
    os.utime(sd, (time.time() + 5, time.time() + 5))  # a new mtime even within the same second
    snapshot = _cycle(exporter)
    assert sorted(t.instance for t in snapshot.targets) == ["127.0.0.1:1", address, "solo"]
    assert [g.gpus for g in snapshot.topologies] == [3]  # each file_sd target adds its TP size
    sd.write_text(json.dumps([{"targets": [address], "labels": {"topology": "nope"}}]))
    os.utime(sd, (time.time() + 10, time.time() + 10))
    snapshot = _cycle(exporter)
    assert len(snapshot.targets) == 3  # a bad file keeps its previous targets
    assert "label topology must name a spec topology" in caplog.text
