"""The compose stack on a real Docker engine: `docker-compose --profile sim up -d` with the images
scripts/build-images makes locally (tests/compose/docker-compose.test.yml maps the pinned upstream
Prometheus and Alertmanager to Debian-built ones and leaves Grafana out), then every service is
healthy, the exporter and Prometheus scrape the simulated fleet by service name, Prometheus runs the
generated rules, a sweep inside the stack writes a crossover, a goodput breach switched on through
the simulator's admin API reaches Alertmanager and its webhook, the app answers, and `down -v`
leaves nothing behind.

All traffic stays on the stack's own bridge (an explicit subnet) and the host's loopback; every load
is bounded, and the stack is taken down also when a check fails."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from crossover.netutil import free_port
from crossover.rules.names import BURN_ALERT
from crossover.spec import load_spec
from tests.helpers import REPO, require, require_binary, wait_for

# The first test also waits for the image builds (minutes on a fresh machine) and the stack to start.
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.timeout(1800)]

COMPOSE_FILE = REPO / "compose" / "docker-compose.yml"
TEST_OVERRIDE = REPO / "tests" / "compose" / "docker-compose.test.yml"
ENV_EXAMPLE = REPO / "compose" / ".env.example"
SIM_SPEC = REPO / "compose" / "specs" / "compose-sim.yaml"
SIM_SERVICES = {"sim", "exporter", "app", "prometheus", "alertmanager", "alert-webhook"}
PROJECT_PREFIX = "crossover-test-"
HEALTHY_TIMEOUT_S = 240.0
ALERT_TIMEOUT_S = 420.0  # the fast-burn alert holds for 2m after its 5m and 1h windows both burn


def docker_engine_answers() -> bool:
    docker = require_binary("docker")
    result = subprocess.run([docker, "info"], capture_output=True, timeout=60, stdin=subprocess.DEVNULL)
    return result.returncode == 0


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    ports: dict[str, int]

    def compose(self, *args: str, timeout: float = 300,
                check: bool = True) -> subprocess.CompletedProcess[str]:
        command = ["docker-compose", "--project-name", self.project, "-f", str(COMPOSE_FILE),
                   "-f", str(TEST_OVERRIDE), "--env-file", str(ENV_EXAMPLE), "--profile", "sim", *args]
        result = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL)
        if check:
            assert result.returncode == 0, f"docker-compose {' '.join(args)}: {result.stderr[-3000:]}"
        return result

    def exec(self, service: str, *command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.compose("exec", "-T", service, *command, timeout=timeout, check=False)

    def python(self, service: str, code: str, timeout: float = 60) -> str:
        """Run Python in a crossover container, on the stack's network (service names resolve)."""
        result = self.exec(service, "python", "-c", code, timeout=timeout)
        assert result.returncode == 0, result.stderr[-3000:]
        return result.stdout

    def health(self) -> dict[str, str]:
        """Service -> health status of its container."""
        ids = self.compose("ps", "-q").stdout.split()
        if not ids:
            return {}
        result = subprocess.run(
            ["docker", "inspect", "--format",
             '{{ index .Config.Labels "com.docker.compose.service" }} '
             "{{ if .State.Health }}{{ .State.Health.Status }}{{ else }}none{{ end }}", *ids],
            capture_output=True, text=True, timeout=60, check=True)
        return dict(line.split() for line in result.stdout.splitlines())

    def leftovers(self) -> dict[str, list[str]]:
        label = f"label=com.docker.compose.project={self.project}"
        found = {}
        for kind, command in (("containers", ["ps", "-a", "-q"]), ("networks", ["network", "ls", "-q"]),
                              ("volumes", ["volume", "ls", "-q"])):
            result = subprocess.run(["docker", *command, "--filter", label], capture_output=True, text=True,
                                    timeout=60, check=True)
            found[kind] = result.stdout.split()
        return found

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False)

    def get(self, port_name: str, path: str, timeout: float = 10) -> Any:
        url = f"http://127.0.0.1:{self.ports[port_name]}{path}"
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read()
        return json.loads(body) if body[:1] in (b"{", b"[") else body.decode()

    def prometheus_query(self, query: str) -> list[dict[str, Any]]:
        data = self.get("PROMETHEUS_PORT", "/api/v1/query?" + urllib.parse.urlencode({"query": query}))
        assert data["status"] == "success", data
        result: list[dict[str, Any]] = data["data"]["result"]
        return result


def wait_for_stack(check: Callable[[], Any], timeout: float, what: str, poll: float = 3.0) -> Any:
    """wait_for, with what a stack still starting raises (an exec that fails, JSON not there yet)
    counted as not yet."""
    return wait_for(check, timeout, what, poll, retry_on=(OSError, ValueError, KeyError, AssertionError))


def free_subnet() -> str:
    """A /24 for the stack's own bridge that no network of the engine uses (two test runs at once
    must not ask for the same one)."""
    ids = subprocess.run(["docker", "network", "ls", "-q"], capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    used = subprocess.run(["docker", "network", "inspect", "--format",
                           "{{ range .IPAM.Config }}{{ .Subnet }} {{ end }}", *ids],
                          capture_output=True, text=True, timeout=60, check=True).stdout.split()
    taken = [ipaddress.ip_network(s) for s in used if ":" not in s]
    for third in range(117, 256):
        candidate = ipaddress.ip_network(f"172.30.{third}.0/24")
        if not any(candidate.overlaps(net) for net in taken):
            return str(candidate)
    pytest.fail(f"no free /24 in 172.30.117-255.0 (used: {used})")


def remove_stale_stacks(env: dict[str, str], ports: dict[str, int]) -> None:
    """A run killed before its teardown leaves its project behind (the engine restarts its
    containers): take down every earlier test project before starting a new one."""
    label = '{{ .Label "com.docker.compose.project" }}'
    result = subprocess.run(["docker", "ps", "-a", "--format", label], capture_output=True, text=True,
                            timeout=60, check=True)
    for project in {p for p in result.stdout.split() if p.startswith(PROJECT_PREFIX)}:
        Stack(project=project, env=env, ports=ports).down()


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    require_binary("docker-compose")
    require(docker_engine_answers(), "no Docker engine answers (make test starts one: scripts/with-dockerd)")
    built = subprocess.run([str(REPO / "scripts" / "build-images"), "--test-images"], cwd=REPO,
                           env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                           timeout=1800, stdin=subprocess.DEVNULL)
    assert built.returncode == 0, built.stderr[-3000:]
    ports = {name: free_port()
             for name in ("APP_PORT", "PROMETHEUS_PORT", "ALERTMANAGER_PORT", "GRAFANA_PORT")}
    env = {**os.environ, **{k: str(v) for k, v in ports.items()}}
    remove_stale_stacks(env, ports)
    env["CROSSOVER_TEST_SUBNET"] = free_subnet()
    stack = Stack(project=f"{PROJECT_PREFIX}{os.getpid()}", env=env, ports=ports)
    try:
        stack.compose("up", "-d", "--no-build", timeout=HEALTHY_TIMEOUT_S + 60)
        yield stack
    finally:
        stack.down()


def test_every_service_is_healthy(stack: Stack) -> None:
    def all_healthy() -> dict[str, str] | None:
        health = stack.health()
        return health if set(health) == SIM_SERVICES and set(health.values()) == {"healthy"} else None

    wait_for_stack(all_healthy, HEALTHY_TIMEOUT_S, "every service healthy")
    assert "grafana" not in stack.health()


def test_the_app_answers_its_health_endpoint(stack: Stack) -> None:
    assert stack.get("APP_PORT", "/_stcore/health").strip() == "ok"


def test_exporter_scrapes_the_simulated_instances_by_service_name(stack: Stack) -> None:
    spec = load_spec(SIM_SPEC)
    instances = {i.name for t in spec.topologies for i in t.instances}

    def targets_up() -> set[str] | None:
        text = stack.python("exporter", "import urllib.request as u; "
                            "print(u.urlopen('http://127.0.0.1:9400/metrics', timeout=5).read().decode())")
        up = {line.split('instance="')[1].split('"')[0] for line in text.splitlines()
              if line.startswith("crossover_target_up{") and line.endswith(" 1.0")}
        return up if up == instances else None

    wait_for_stack(targets_up, 60, "the exporter's targets up")


def test_prometheus_runs_the_generated_rules_and_scrapes_exporter_and_fleet(stack: Stack) -> None:
    generated = yaml.safe_load((REPO / "compose" / "prometheus" / "compose-sim" / "rules.yml").read_text())
    loaded = stack.get("PROMETHEUS_PORT", "/api/v1/rules")["data"]["groups"]
    assert sorted(g["name"] for g in loaded) == sorted(g["name"] for g in generated["groups"])
    assert sum(len(g["rules"]) for g in loaded) == sum(len(g["rules"]) for g in generated["groups"])

    def scraped() -> dict[str, int] | None:
        up = stack.prometheus_query("sum by (job) (up)")
        jobs = {r["metric"]["job"]: int(float(r["value"][1])) for r in up}
        return jobs if jobs == {"vllm": 3, "crossover-exporter": 1} else None

    wait_for_stack(scraped, 90, "Prometheus scraping the fleet and the exporter")
    # The rules evaluate without error on what it scraped.
    wait_for_stack(lambda: all(
        r["health"] == "ok" for g in stack.get("PROMETHEUS_PORT", "/api/v1/rules")["data"]["groups"]
        for r in g["rules"]), 60, "every rule group evaluated healthy")


def test_a_sweep_inside_the_stack_writes_a_crossover(stack: Stack) -> None:
    out = f"/results/test-sweep-{os.getpid()}"
    result = stack.exec("app", "crossover", "sweep", "/specs/compose-sim.yaml", "--concurrency", "1,8",
                        "--requests", "16", "--input-len", "64", "--output-len", "16", "--timeout", "60",
                        "--out", out, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    crossover = json.loads(stack.python("app", f"print(open('{out}/crossover.json').read())"))
    assert crossover["crossovers"], crossover


def test_a_goodput_breach_reaches_alertmanager_and_the_webhook(stack: Stack) -> None:
    # Slow tp4-0 down far past the TPOT SLO through the simulator's admin API, then send it a
    # bounded stream of requests (1 req/s for at most the alert's wait) from inside the stack.
    stack.python("app", "import urllib.request as u; u.urlopen(u.Request('http://tp4-0:8100/admin/faults', "
                 "data=b'{\"slowdown\": 20}', headers={'Content-Type': 'application/json'}), timeout=10)")
    out = f"/results/test-breach-{os.getpid()}"
    load = stack.compose("exec", "-d", "-T", "app", "crossover", "sweep", "/specs/compose-sim.yaml",
                         "--topology", "tp4x1", "--rate", "1", "--duration", str(int(ALERT_TIMEOUT_S)),
                         "--input-len", "64", "--output-len", "16", "--timeout", "60", "--out", out)
    assert load.returncode == 0

    def burn_alert() -> list[dict[str, Any]]:
        alerts = stack.get("ALERTMANAGER_PORT", "/api/v2/alerts")
        return [a for a in alerts if a["labels"].get("alertname") == BURN_ALERT
                and a["labels"].get("topology") == "tp4x1"]

    alerts = wait_for_stack(burn_alert, ALERT_TIMEOUT_S, f"{BURN_ALERT} for tp4x1 in Alertmanager", 10)
    assert alerts[0]["labels"]["severity"] == "critical"
    # Alertmanager delivered it to the stack's webhook, which logs each notification.
    wait_for_stack(lambda: BURN_ALERT in stack.compose("logs", "--no-color", "alert-webhook").stdout, 60,
                   "the webhook's log line")


def test_down_leaves_no_container_network_or_volume(stack: Stack) -> None:
    assert any(stack.leftovers().values())  # the stack was up: the check below can fail
    stack.down()
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
