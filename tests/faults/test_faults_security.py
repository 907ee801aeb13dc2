"""Security: a bearer token reaches the targets that need it and nowhere else (not the exporter's
log, /metrics, /api/v1/snapshot, the app's server view, the sweep's results or its requests); the
exporter listens on loopback unless told otherwise; the sweep sends traffic only to the spec's
targets (entrypoint when there is one, else the instances), and so does the app.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from streamlit.testing.v1 import AppTest

from crossover.app.serverview import ServerPoller
from crossover.cli import build_parser
from crossover.loadgen.plan import LengthDist, SweepPlan
from crossover.loadgen.sweep import run_sweep
from crossover.netutil import free_port
from crossover.spec import FleetSpec, load_spec, parse_spec
from tests.faults.faults_exporter import HEALTHY_PAYLOAD, errors, get, samples, snapshot, up
from tests.faults.faults_servers import LoopbackApp, serving, tokenizer_routes
from tests.helpers import REPO, SPECS, wait_for

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]

TOKEN_ENV = "CROSSOVER_FAULTS_SCRAPE_TOKEN"


async def _completion(request: web.Request) -> web.StreamResponse:
    """A minimal well-formed streamed completion: two tokens, usage, [DONE]."""
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for n in (1, 2):
        event = {"id": "cmpl-sec", "object": "text_completion",
                 "choices": [{"index": 0, "text": f" t{n}", "finish_reason": None if n < 2 else "length"}],
                 "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}}
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    assert body.get("stream") is True
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _spec(data_topologies: list[dict[str, object]], scrape: dict[str, object] | None = None) -> FleetSpec:
    data = load_spec(SPECS / "seed-70b-h100.yaml").model_dump(mode="json")
    data["topologies"] = data_topologies
    data["simulator"]["faults"] = {}
    data["scrape"].update(scrape or {})
    return parse_spec(data)


def _proxied_and_balanced(url: str, scrape: dict[str, object] | None = None) -> FleetSpec:
    """One topology behind an entrypoint (its instances must get nothing), one balanced client-side."""
    return _spec([
        {"name": "proxied", "gpus": 4, "tensor_parallel_size": 2,
         "entrypoint": {"url": f"{url}/entry"},
         "instances": [{"name": "behind-0", "url": f"{url}/behind-0"},
                       {"name": "behind-1", "url": f"{url}/behind-1"}]},
        {"name": "balanced", "gpus": 4, "tensor_parallel_size": 2,
         "entrypoint": {"balance": "round_robin"},
         "instances": [{"name": "replica-0", "url": f"{url}/replica-0"},
                       {"name": "replica-1", "url": f"{url}/replica-1"}]},
    ], scrape)


@dataclass
class Secured:
    token: str
    server: LoopbackApp
    spec: FleetSpec
    exporter_url: str
    exporter_port: int
    exporter_pid: int
    log: Path
    folder: Path


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    token = "tok-" + secrets.token_hex(16)
    folder = tmp_path_factory.mktemp("security")

    async def guarded(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != f"Bearer {token}":
            return web.Response(status=401, text="unauthorized")
        return web.Response(body=HEALTHY_PAYLOAD, content_type="text/plain")

    async def other_token(request: web.Request) -> web.Response:
        # rejects every token: its error must be reported without the token in it
        return web.Response(status=403, text=f"forbidden: {request.headers.get('Authorization')}")

    routes = {("GET", "/good/metrics"): guarded, ("GET", "/other/metrics"): other_token,
              ("POST", "/good/v1/completions"): _completion, **tokenizer_routes("/good")}
    with serving(routes) as server:
        spec = _spec([
            {"name": "secure", "gpus": 4, "tensor_parallel_size": 2, "instances": [
                {"name": "good", "url": f"{server.url}/good"},
                {"name": "other", "url": f"{server.url}/other"}]},
            {"name": "gone", "gpus": 2, "tensor_parallel_size": 2, "instances": [
                {"name": "closed", "url": f"http://127.0.0.1:{free_port()}"}]},
        ], {"interval": "1s", "timeout": "500ms", "bearer_token_env": TOKEN_ENV})
        spec_path = folder / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        port = free_port()
        log = folder / "exporter.log"
        with log.open("wb") as sink:
            # no --bind: the default must be loopback
            exporter = subprocess.Popen(
                [sys.executable, "-m", "crossover", "exporter", str(spec_path), "--port", str(port),
                 "--log-level", "debug"], stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=REPO, env={**os.environ, TOKEN_ENV: token})
        try:
            url = f"http://127.0.0.1:{port}"

            def healthy() -> bool:
                assert exporter.poll() is None, log.read_text()[-3000:]
                try:
                    get(url + "/health", timeout=2)
                    return True
                except OSError:
                    return False

            wait_for(healthy, 60, "the exporter")
            yield Secured(token, server, spec, url, port, exporter.pid, log, folder)
        finally:
            exporter.send_signal(signal.SIGTERM)
            try:
                exporter.wait(10)
            except subprocess.TimeoutExpired:
                exporter.kill()
                exporter.wait(10)


def test_the_token_reaches_its_target_and_leaks_nowhere(secured: Secured, tmp_path: Path) -> None:
    url, token = secured.exporter_url, secured.token
    wait_for(lambda: errors(samples(url), "other", "http_status") >= 2
             and errors(samples(url), "closed", "connection") >= 2, 30, "the failing targets reported")
    wait_for(lambda: up(samples(url), "good") == 1.0, 15, "the guarded target up with the token")
    assert up(samples(url), "other") == 0.0
    sent = [h.get("Authorization") for method, path, h in secured.server.seen if path == "/good/metrics"]
    assert sent and set(sent) == {f"Bearer {token}"}, "the token was not sent where it is needed"
    # everything the exporter served and wrote
    served = {"/metrics": get(url + "/metrics"), "/api/v1/snapshot": get(url + "/api/v1/snapshot"),
              "/health": get(url + "/health")}
    assert "other" in json.dumps(snapshot(url))  # the failing target's error is in the snapshot...
    # ...the app's server-side view of it
    poller = ServerPoller("exporter", url, secured.spec)
    poller.poll_once()
    history = poller.history()
    served["app server view"] = (history.frame.to_csv() + str(history.error)).encode()
    # a sweep with the same spec: its results folder and the requests it sent
    plan = SweepPlan(levels=(1,), requests_per_level=2, input_len=LengthDist.fixed(3),
                     output_len=LengthDist.fixed(2), timeout_s=10)
    result = run_sweep(secured.spec, plan, tmp_path / "run", ["secure"], n_boot=0)
    assert result.requests["ok"].sum() == 1  # round robin; the "other" instance has no completions route
    for path in sorted((tmp_path / "run").rglob("*")):
        if path.is_file():
            served[str(path.relative_to(tmp_path))] = path.read_bytes()
    sweep_headers = [h for method, path, h in secured.server.seen if path.endswith("/v1/completions")]
    assert sweep_headers
    served["sweep request headers"] = json.dumps(sweep_headers).encode()
    log = secured.log.read_bytes()
    assert b"/other/metrics" in log or b"other" in log, "the log is empty: nothing was checked"
    served["exporter log"] = log
    leaks = [where for where, content in served.items() if token.encode() in content]
    assert not leaks, f"the bearer token appears in: {leaks}"


def _listening_addresses(port: int) -> set[str]:
    """Local addresses of the LISTEN sockets on a port, from /proc/net/tcp and tcp6."""
    found: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            address, state = fields[1], fields[3]
            host, port_hex = address.rsplit(":", 1)
            if state == "0A" and int(port_hex, 16) == port:
                found.add(host)
    return found


def test_the_exporter_listens_on_loopback_by_default(secured: Secured) -> None:
    assert _listening_addresses(secured.exporter_port) == {"0100007F"}  # 127.0.0.1, nothing else
    parser = build_parser()
    assert parser.parse_args(["exporter", "spec.yaml"]).bind == "127.0.0.1"
    assert parser.parse_args(["app", "spec.yaml"]).address == "127.0.0.1"


def test_the_sweep_sends_traffic_only_to_the_spec_targets(tmp_path: Path) -> None:
    names = ("entry", "behind-0", "behind-1", "replica-0", "replica-1", "canary")
    routes = {("POST", f"/{name}/v1/completions"): _completion for name in names} | tokenizer_routes(
        *(f"/{name}" for name in names))
    with serving(routes) as server:
        spec = _proxied_and_balanced(server.url)
        plan = SweepPlan(levels=(1, 2), requests_per_level=4, input_len=LengthDist.fixed(3),
                         output_len=LengthDist.fixed(2), timeout_s=10)
        result = run_sweep(spec, plan, tmp_path, n_boot=0)
        hits: dict[str, int] = {}
        for _method, path, _headers in server.seen:
            if path.endswith("/v1/completions"):  # the tokenizer is asked too, only spec targets
                hits[path.split("/")[1]] = hits.get(path.split("/")[1], 0) + 1
        assert {p.split("/")[1] for _m, p, _h in server.seen} <= set(names)
    assert result.requests["ok"].all()
    assert hits == {"entry": 8, "replica-0": 4, "replica-1": 4}, hits


def _page_text(app: AppTest) -> str:
    """Everything the page shows as text, tables included (as CSV)."""
    parts: list[str] = []
    for kind in ("title", "caption", "markdown", "subheader", "header", "error", "warning", "success", "info",
                 "text", "code", "json"):
        parts.extend(str(element.value) for element in getattr(app, kind))
    parts.extend(bar.proto.text for bar in app.get("progress"))
    parts.extend(frame.value.to_csv() for frame in app.dataframe)
    return "\n".join(parts)


def test_the_app_sends_traffic_only_to_the_spec_targets_and_shows_no_token(
        secured: Secured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The app's own path (form, pre-flight check, sweep in a child process, page): requests reach
    only the spec's targets, and the scrape token is on neither the page nor in the results."""
    monkeypatch.setenv(TOKEN_ENV, secured.token)
    names = ("entry", "behind-0", "behind-1", "replica-0", "replica-1")
    routes = {("POST", f"/{name}/v1/completions"): _completion for name in names} | tokenizer_routes(
        *(f"/{name}" for name in names))
    results = tmp_path / "results"
    with serving(routes) as server:
        spec = _proxied_and_balanced(server.url, {"bearer_token_env": TOKEN_ENV})
        spec_path = tmp_path / "spec.yaml"
        spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
        monkeypatch.setattr(sys, "argv", ["page.py", str(spec_path), "--results", str(results),
                                          "--exporter", secured.exporter_url])
        app = AppTest.from_file(str(REPO / "app" / "page.py"), default_timeout=30)
        app.run()
        app.text_input(key="levels").set_value("1,2")
        app.number_input(key="requests_per_level").set_value(4)
        app.text_input(key="input_len").set_value("3")
        app.text_input(key="output_len").set_value("2")
        app.number_input(key="bootstrap").set_value(0)
        app.button(key="start").click().run()
        assert not app.exception and not app.error, _page_text(app)
        deadline = time.monotonic() + 60
        while "Sweep finished" not in _page_text(app):
            assert time.monotonic() < deadline, _page_text(app)
            time.sleep(0.5)
            app.run()
        hits: dict[str, int] = {}
        for _method, path, _headers in server.seen:
            if path.endswith("/v1/completions"):  # the tokenizer is asked too, only spec targets
                hits[path.split("/")[1]] = hits.get(path.split("/")[1], 0) + 1
        assert {p.split("/")[1] for _m, p, _h in server.seen} <= set(names)
    assert not app.exception and not app.error, _page_text(app)
    assert hits == {"entry": 8, "replica-0": 4, "replica-1": 4}, hits
    shown = _page_text(app)
    assert "proxied" in shown and "balanced" in shown, "the page shows no results: nothing was checked"
    written = {str(p.relative_to(results)): p.read_bytes() for p in results.rglob("*") if p.is_file()}
    assert written, "the sweep wrote no results"
    leaks = [where for where, content in written.items() if secured.token.encode() in content]
    assert secured.token not in shown and not leaks, leaks
