"""The package works installed from its wheel, with no checkout: the wheel and its dependencies go
into a wheelhouse (scripts/build-images --wheelhouse-only, the air-gapped path of docs/compose.md),
a fresh virtual environment outside the repository installs from it with no index, and `crossover
init`, `validate`, `demo --headless`, `rules` and `dashboards` run from an empty folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from crossover.netutil import free_port
from crossover.processes import stop_group
from tests.helpers import PACKAGE_DIRS, REPO, SPECS


@pytest.fixture(scope="module")
def wheelhouse() -> Path:
    result = subprocess.run([str(REPO / "scripts" / "build-images"), "--wheelhouse-only"], cwd=REPO,
                            env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True,
                            timeout=900, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    return REPO / "build" / "wheelhouse"


@pytest.fixture(scope="module")
def installed(wheelhouse: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Environment variables under which `crossover` is the wheel's, in a venv outside the checkout."""
    venv = tmp_path_factory.mktemp("fresh") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    result = subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
                             "--no-index", "--find-links", str(wheelhouse), "vllm-crossover"],
                            capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    yield env


def crossover(env: dict[str, str], cwd: Path, *args: str,
              timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["crossover", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_wheel_ships_every_example_spec(wheelhouse: Path) -> None:
    wheel = next(wheelhouse.glob("vllm_crossover-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for spec in SPECS.glob("*.yaml"):
        assert f"crossover/examples/{spec.name}" in names, f"{spec.name} is not in the wheel"
    # The developer support (devkit/: real vLLM servers, the /metrics contract) stays in the checkout.
    assert not [n for n in names if n.startswith(("tests/", "compose/", "docs/")) or "devkit" in n.split("/")]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_installed_package_runs_from_an_empty_folder(installed: dict[str, str], tmp_path: Path) -> None:
    where = subprocess.run(["python", "-c", "import crossover; print(crossover.__file__)"], cwd=tmp_path,
                           env=installed, capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and not Path(where.stdout.strip()).is_relative_to(REPO), where

    result = crossover(installed, tmp_path, "init")
    assert result.returncode == 0, result.stderr
    spec = tmp_path / "fleet.yaml"
    assert spec.read_text().startswith("# A vllm-crossover fleet spec")
    assert crossover(installed, tmp_path, "validate", "fleet.yaml").returncode == 0
    for example in ("pd-8k-prompts", "cpu-real-vllm"):
        result = crossover(installed, tmp_path, "init", f"{example}.yaml", "--example", example)
        assert result.returncode == 0, result.stderr
        result = crossover(installed, tmp_path, "validate", f"{example}.yaml")
        assert result.returncode == 0, result.stderr

    # The generators write complete output from the spec alone.
    result = crossover(installed, tmp_path, "rules", "fleet.yaml", "--out", "rules")
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load((tmp_path / "rules" / "rules.yml").read_text())["groups"]
    result = crossover(installed, tmp_path, "dashboards", "fleet.yaml", "--out", "dashboards")
    assert result.returncode == 0, result.stderr
    assert list((tmp_path / "dashboards").glob("*.json"))

    # No spec argument: the demo runs the shipped seed example. A short bounded sweep.
    result = crossover(installed, tmp_path, "demo", "--headless", "--concurrency", "1,4", "--requests", "8",
                       "--input-len", "64", "--output-len", "16", "--out", "run", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sweep summary" in result.stdout, result.stdout[-2000:]
    assert (tmp_path / "run" / "sweep" / "crossover.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("command", "path"), [("exporter", "/health"), ("app", "/_stcore/health")])
def test_installed_servers_start_from_an_empty_folder(installed: dict[str, str], tmp_path: Path,
                                                      command: str, path: str) -> None:
    """The exporter and the app (its page script is package data) answer, on loopback, with no checkout."""
    assert crossover(installed, tmp_path, "init").returncode == 0
    port = free_port()
    bind = "--bind" if command == "exporter" else "--address"
    server = subprocess.Popen(["crossover", command, "fleet.yaml", "--port", str(port), bind, "127.0.0.1"],
                              cwd=tmp_path, env=installed, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline, answer = time.monotonic() + 90, ""
        while time.monotonic() < deadline and server.poll() is None and not answer:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                    answer = response.read().decode()
            except OSError:
                time.sleep(1)
        assert answer, f"crossover {command} did not answer {path} (exit {server.poll()})"
    finally:
        stop_group(server, 30)


def test_no_shipped_module_reads_the_source_tree() -> None:
    """A file found through the source tree's parents is missing from a wheel."""
    offenders = []
    for folder in PACKAGE_DIRS:
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "parent.parent" in text:
                offenders.append(str(path.relative_to(REPO)))
            # A module may find its own sibling (app/cli.py runs page.py), nothing above its folder.
            sibling = r"Path\(__file__\)\.resolve\(\)\.parent / \"\w+\.py\""
            for line in text.splitlines():
                if "__file__" in line and not re.search(sibling, line):
                    offenders.append(f"{path.relative_to(REPO)}: {line.strip()}")
    assert offenders == []
