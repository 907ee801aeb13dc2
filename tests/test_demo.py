"""`crossover demo`: the headless sweep agrees with the simulator's ground truth, the interactive stack
comes up wired together (Prometheus scrapes the fleet with the generated rules and alerts reach the
webhook through Alertmanager), and Ctrl-C leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from crossover import slo
from crossover.netutil import spec_on_free_ports
from crossover.sim.truth import ground_truth_crossover
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS, require_binary, wait_for

SEED = SPECS / "seed-70b-h100.yaml"
LEVELS = (2, 4, 8, 16)  # around the seed's crossover (~6 at 128/64 tokens), each level a few seconds
INPUT_LEN, OUTPUT_LEN = 128, 64


def demo(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crossover", "demo", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def assert_nothing_left(out: Path) -> None:
    pids = json.loads((out / "logs" / "pids.json").read_text())
    assert pids, "the demo recorded no children"
    left = {name: pid for name, pid in pids.items() if group_alive(pid)}
    assert not left, f"process groups still alive after the demo exited: {left}"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.mark.slow
@pytest.mark.timeout(300)  # about a minute alone; several times that on a shared, busy 2-core machine
def test_headless_demo_finds_the_simulators_crossover(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 8 rounds per level: enough requests that a scheduling hiccup of a busy 2-core machine does not
    # move the crossing by a level (4 rounds did, under load), and still about a minute in all.
    result = demo("--headless", "--concurrency", ",".join(map(str, LEVELS)), "--rounds", "8",
                  "--input-len", str(INPUT_LEN), "--output-len", str(OUTPUT_LEN), "--out", str(out),
                  timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    # The per-level table and the crossover sentence are on stdout.
    assert "sweep summary" in result.stdout
    assert re.search(r"tp2x2 overtakes tp4x1 in goodput at concurrency about [\d.]+", result.stdout), \
        result.stdout[-2000:]
    assert_nothing_left(out)

    crossings = json.loads((out / "sweep" / "crossover.json").read_text())["crossovers"]
    measured = next(c for c in crossings if c["metric"] == "output_tps" and c["kind"] == "crossing")
    truth = ground_truth_crossover(load_spec(SEED), "tp4x1", "tp2x2", INPUT_LEN, OUTPUT_LEN, LEVELS)
    assert truth is not None and 4 < truth < 8  # the model's crossing sits between two levels
    assert measured["winner"] == "tp2x2" and measured["direction"] == "b_overtakes_a"
    assert measured["x"] == pytest.approx(truth, rel=0.35), (measured, truth)


def test_missing_spec_is_one_line(tmp_path: Path) -> None:
    result = demo("--headless", "--spec", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0 and "nope.yaml" in result.stderr


def test_bad_spec_is_one_line() -> None:
    result = demo("--headless", "--spec", str(SPECS.parent.parent / "tests" / "fixtures" / "bad-specs"
                                               / "bad-port.yaml"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("where", ["file", "under-file"])
def test_out_that_cannot_be_a_folder_is_one_line(tmp_path: Path, where: str) -> None:
    blocker = tmp_path / "taken"
    blocker.write_text("not a folder")
    out = blocker if where == "file" else blocker / "run"
    result = demo("--headless", "--out", str(out))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith("crossover demo: --out: ") and str(out) in result.stderr
    assert result.stderr.strip().count("\n") == 0


def test_no_sim_without_servers_says_what_to_do(tmp_path: Path) -> None:
    spec = tmp_path / "real.yaml"
    spec.write_text(yaml.safe_dump(spec_on_free_ports(load_spec(SEED)).model_dump(mode="json")))
    result = demo("--headless", "--no-sim", "--spec", str(spec), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "--no-sim: no answer at /health" in result.stderr and "tp4-0" in result.stderr


@pytest.mark.parametrize("flags", [("--requests", "0"), ("--rounds", "-1"), ("--concurrency", "0,x"),
                                   ("--input-len", "foo"), ("--output-len", "uniform:5"),
                                   ("--output-len", "0")])
def test_bad_sweep_flags_are_one_line(tmp_path: Path, flags: tuple[str, str]) -> None:
    result = demo("--headless", *flags, "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and flags[0] in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_interactive_stack_is_wired_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    require_binary("prometheus")
    require_binary("prometheus-alertmanager")
    out = tmp_path / "run"
    log = (tmp_path / "demo.log").open("w+")
    process = subprocess.Popen([sys.executable, "-m", "crossover", "demo", "--no-app", "--no-sweep",
                                "--free-ports", "--out", str(out)], stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 120
        text = ""
        while "press Ctrl-C" not in text and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            text = Path(log.name).read_text()
        assert process.poll() is None and "press Ctrl-C" in text, text
        urls = dict(re.findall(r"^  (\w[\w-]*)\s+(http://127\.0\.0\.1:\d+)", text, re.M))
        prometheus, alertmanager = urls["prometheus"], urls["alertmanager"]
        spec = load_spec(out / "spec.yaml")
        instances = {i.name for t in spec.topologies for i in t.instances}

        # Prometheus scrapes every simulated instance and has loaded the generated rules.
        def targets_up() -> bool:
            active = get_json(prometheus + "/api/v1/targets")["data"]["activeTargets"]
            up = {t["labels"].get("replica") for t in active if t["health"] == "up"}
            return instances <= up
        wait_for(targets_up, 60, "Prometheus to scrape every instance")
        groups = wait_for(lambda: get_json(prometheus + "/api/v1/rules")["data"]["groups"], 30,
                          "Prometheus to load the generated rules")
        assert any(r["type"] == "alerting" for g in groups for r in g["rules"])
        # Prometheus discovers its Alertmanager asynchronously, some time after it is ready.
        def alertmanagers() -> list[str]:
            managers = get_json(prometheus + "/api/v1/alertmanagers")["data"]["activeAlertmanagers"]
            return [m["url"] for m in managers]
        assert wait_for(alertmanagers, 30, "Prometheus to find Alertmanager") == [
            alertmanager + "/api/v2/alerts"]

        # Alertmanager routes a page (severity critical) to the webhook, which writes alerts.jsonl.
        alert = [{"labels": {"alertname": "DemoCheck", "severity": "critical", "topology": "tp4x1"},
                  "annotations": {"summary": "wiring check"}}]
        request = urllib.request.Request(alertmanager + "/api/v2/alerts", data=json.dumps(alert).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request, timeout=5).close()
        alerts_file = out / "alerts.jsonl"
        line = wait_for(lambda: alerts_file.read_text().strip(), 30,
                        "the alert to reach the webhook")
        assert json.loads(line.splitlines()[0])["alertname"] == "DemoCheck"

        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=40) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()
    assert "stopped" in Path(log.name).read_text()
    assert_nothing_left(out)


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_headless_demo_on_real_vllm_servers_does_not_simulate(real_vllm_fleet: Any, tmp_path: Path) -> None:
    """A spec whose instances all answer /health is a real fleet: the demo detects it (no --no-sim),
    starts no simulator, and sweeps the real servers."""
    spec = tmp_path / "real.yaml"
    spec.write_text(yaml.safe_dump(real_vllm_fleet.spec.model_dump(mode="json")))
    out = tmp_path / "run"
    result = demo("--headless", "--spec", str(spec), "--concurrency", "1,4", "--requests", "8",
                  "--input-len", "32", "--output-len", "16", "--out", str(out), timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(real servers)" in result.stderr
    pids = json.loads((out / "logs" / "pids.json").read_text())
    assert set(pids) == {"sweep"}, pids  # no simulator
    assert "sweep summary" in result.stdout and "big1x2c" in result.stdout and "small2x1c" in result.stdout
    crossings = json.loads((out / "sweep" / "crossover.json").read_text())["crossovers"]
    assert any(c["metric"] == slo.GOODPUT_REQUESTS for c in crossings)


def test_alert_webhook_prints_each_alert_and_refuses_garbage(tmp_path: Path) -> None:
    from crossover.netutil import free_port

    port, log = free_port(), tmp_path / "alerts.jsonl"
    hook = subprocess.Popen([sys.executable, "-m", "crossover.demo.webhook", "--port", str(port),
                             "--log", str(log)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        assert hook.stdout is not None and "alert webhook on" in hook.stdout.readline()
        url = f"http://127.0.0.1:{port}/alerts"

        def post(body: bytes) -> int:
            request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return exc.code

        assert post(b"not json") == 400
        assert post(b"[1, 2]") == 400
        notification = {"version": "4", "status": "firing", "alerts": [
            {"status": "firing", "labels": {"alertname": "VllmGoodputBudgetBurn", "severity": "critical",
                                            "topology": "tp2x2", "slo": "tpot"},
             "annotations": {"summary": "burning"}, "startsAt": "2026-12-02T14:00:00Z"},
            {"status": "resolved", "labels": {"alertname": "Other", "severity": "warning"}}]}
        assert post(json.dumps(notification).encode()) == 200
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(x["alertname"], x["status"], x["severity"]) for x in lines] == [
            ("VllmGoodputBudgetBurn", "firing", "critical"), ("Other", "resolved", "warning")]
        assert lines[0]["labels"]["topology"] == "tp2x2" and lines[0]["summary"] == "burning"
    finally:
        hook.send_signal(signal.SIGTERM)
        hook.wait(timeout=20)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_running_servers_are_detected_and_used_as_they_are(tmp_path: Path) -> None:
    """Every instance answering /health means a real fleet: the demo starts no simulator of its own
    and sweeps the servers at the spec's own URLs (here a simulator started outside the demo)."""
    from crossover.sim.fleet import running_fleet

    spec = spec_on_free_ports(load_spec(SEED))
    path = tmp_path / "running.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    out = tmp_path / "run"
    with running_fleet(spec) as fleet:
        result = demo("--headless", "--spec", str(path), "--concurrency", "2", "--requests", "4",
                      "--output-len", "8", "--out", str(out), timeout=180)
        served = {name: len(fleet.requests(name)) for name in ("tp4-0", "tp2-0", "tp2-1")}
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(real servers)" in result.stderr
    assert set(json.loads((out / "logs" / "pids.json").read_text())) == {"sweep"}
    assert served["tp4-0"] == 4 and served["tp2-0"] + served["tp2-1"] == 4, served


@pytest.mark.timeout(120)
def test_some_instances_up_is_ambiguous(tmp_path: Path) -> None:
    from crossover.sim.fleet import running_fleet

    spec = spec_on_free_ports(load_spec(SEED))
    data = spec.model_dump(mode="json")
    data["topologies"] = [t for t in data["topologies"] if t["name"] == "tp4x1"]
    with running_fleet(FleetSpec.model_validate(data)):
        path = tmp_path / "half.yaml"
        path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
        result = demo("--headless", "--spec", str(path), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "['tp4-0'] answer but ['tp2-0', 'tp2-1'] do not" in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_ctrl_c_during_the_sweep_interrupts_it_and_keeps_finished_levels(tmp_path: Path) -> None:
    out = tmp_path / "run"
    log = tmp_path / "demo.log"
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "-m", "crossover", "demo", "--headless", "--concurrency",
                                    "1,2,4,8,16,32", "--out", str(out)], stdout=sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            wait_for(lambda: "concurrency 1:" in log.read_text(), 120, "the first level to finish")
            process.send_signal(signal.SIGINT)
            assert process.wait(timeout=40) == 130
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    text = log.read_text()
    assert "crossover sweep: interrupted" in text and "crossover demo: stopped" in text, text[-2000:]
    assert any((out / "sweep" / "levels").rglob("*")), "the finished level was not kept"
    assert_nothing_left(out)


def test_every_command_the_demo_builds_is_accepted_by_the_cli(tmp_path: Path) -> None:
    """The demo drives the parts through their command lines: a renamed flag must fail here, not
    at `make demo`."""
    import argparse

    from crossover.cli import build_parser
    from crossover.demo import cli as demo_module

    parser = build_parser()
    spec = tmp_path / "spec.yaml"

    def parse(command: list[str]) -> argparse.Namespace:
        assert command[:3] == [sys.executable, "-m", "crossover"]
        return parser.parse_args(command[3:])

    assert parse(demo_module.sim_command(spec)).spec == str(spec)
    pdproxy = parse(demo_module.pdproxy_command(spec, "pd1p1d"))
    assert (pdproxy.spec, pdproxy.topology, pdproxy.bind) == (str(spec), "pd1p1d", None)
    exporter = parse(demo_module.exporter_command(spec, 9411))
    assert (exporter.port, exporter.bind) == (9411, "127.0.0.1")
    app = parse(demo_module.app_command(spec, 8555, tmp_path / "app", "http://127.0.0.1:9411",
                                        "http://127.0.0.1:9099", tmp_path / "app" / "sweep"))
    assert (app.port, app.address, app.exporter, app.prometheus, app.follow) == (
        8555, "127.0.0.1", "http://127.0.0.1:9411", "http://127.0.0.1:9099", str(tmp_path / "app" / "sweep"))
    args = demo_module_args("--concurrency", "1,2", "--requests", "5", "--input-len", "16")
    sweep = parse(demo_module.sweep_command(args, spec, tmp_path / "sweep", headless=True))
    assert (sweep.concurrency, sweep.requests, sweep.input_len, sweep.no_progress) == ("1,2", 5, "16", True)
    args = demo_module_args("--rate", "0.5,1")
    sweep = parse(demo_module.sweep_command(args, spec, tmp_path / "sweep", headless=False))
    assert sweep.rate == "0.5,1" and sweep.concurrency is None and sweep.rounds == 4.0  # the sweep's own


def demo_module_args(*argv: str) -> Any:
    from crossover.cli import build_parser

    return build_parser().parse_args(["demo", *argv])


def test_prometheus_config_is_what_crossover_rules_writes(tmp_path: Path) -> None:
    """The demo's prometheus.yml is `crossover rules --exporter-target --alertmanager`'s, so its targets
    carry the labels the rules and dashboards select on, and its rule file loads."""
    from crossover.demo import cli as demo_module
    from crossover.rules.render import scrape_config

    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    stack = demo_module.Stack(out=tmp_path, spec_path=tmp_path / "spec.yaml", simulated=True,
                              urls={"exporter": "http://127.0.0.1:9411"})
    path = demo_module.write_prometheus_config(stack, spec, "127.0.0.1:9093")
    config = yaml.safe_load(path.read_text())
    assert config == scrape_config(spec, ["rules.yml"], "127.0.0.1:9411", "127.0.0.1:9093")
    assert stack.rules_dir == path.parent and (path.parent / "rules.yml").exists()
    labels = [group["labels"] for group in config["scrape_configs"][0]["static_configs"]]
    assert {"topology", "role", "gpus", "replica"} <= set(labels[0])
    assert any(label["role"] == "entrypoint" for label in labels)
