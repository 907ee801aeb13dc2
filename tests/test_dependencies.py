"""Every third-party import of the package is a dependency declared in pyproject.toml with a lower
bound, and the load client, whose hot path leans hardest on its libraries, runs its tests on the
lowest versions it declares (so a bound that is too low fails here, not in a user's sweep)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from tests.helpers import PACKAGE_DIRS, REPO, require

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
LOAD_CLIENT = ("loadgen/traffic/httpclient.py", "loadgen/traffic/transport.py", "loadgen/traffic/client.py",
               "loadgen/traffic/sse.py", "crossover/eventloop.py")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _declared() -> dict[str, str]:
    """Distribution name (normalised) -> its lower bound, from the dependencies and the extras (a
    lazy import for an optional part, such as the real-vLLM recipe's tokenizer, may come from one)."""
    project = PYPROJECT["project"]
    bounds = {}
    extras = [r for group in project["optional-dependencies"].values() for r in group]
    for requirement in [*project["dependencies"], *extras]:
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:[^;]*?(?:>=|==)\s*([0-9][^,;\s]*))?", requirement)
        assert match, requirement
        bounds[_normal(match.group(1))] = match.group(2) or ""
    return bounds


def _third_party_imports(files: list[Path]) -> dict[str, set[str]]:
    """Top-level module -> the files that import it, for modules outside the standard library and
    the package itself."""
    found: dict[str, set[str]] = {}
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("crossover", "__future__"):
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _distribution(module: str) -> str:
    distributions = importlib.metadata.packages_distributions().get(module)
    assert distributions, f"{module}: imported by the package but installed by no distribution"
    return _normal(distributions[0])


@pytest.mark.slow
def test_every_import_of_the_package_is_declared_with_a_lower_bound() -> None:
    files = [p for folder in PACKAGE_DIRS for p in (REPO / folder).glob("*.py")]
    declared = _declared()
    for module, importers in sorted(_third_party_imports(files).items()):
        distribution = _distribution(module)
        assert distribution in declared, f"{module} ({distribution}), imported by {sorted(importers)}, " \
            "is not declared in pyproject.toml"
        assert declared[distribution], f"{distribution}: no lower bound in pyproject.toml"


@pytest.mark.slow
def test_the_load_client_passes_its_tests_on_its_lowest_declared_versions(tmp_path: Path) -> None:
    declared = _declared()
    modules = sorted(_third_party_imports([REPO / f for f in LOAD_CLIENT]))
    assert modules, "the load client imports no library: this test has nothing to check"
    lowest = [declared[_distribution(m)] for m in modules]
    pins = [f"{_distribution(m)}=={v}" for m, v in zip(modules, lowest, strict=True)]
    target = tmp_path / "lowest"
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                              "--only-binary=:all:", "--target", str(target), *pins],
                             capture_output=True, text=True, timeout=300)
    require(install.returncode == 0, f"cannot install {pins}: {install.stderr.strip()[-300:]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), os.environ.get("PYTHONPATH", "")])}
    check = "import importlib.metadata as m; print(" + ", ".join(
        f"m.version({_distribution(name)!r})" for name in modules) + ")"
    versions = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env,
                              cwd=tmp_path)
    assert [Version(v) for v in versions.stdout.split()] == [Version(v) for v in lowest], \
        versions.stdout + versions.stderr
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                            "tests/loadgen/test_loadgen_httpclient.py",
                            "tests/loadgen/test_loadgen_client.py"],
                           capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
