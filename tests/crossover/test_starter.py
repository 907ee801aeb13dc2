"""`crossover init`: every example of compose/specs ships (as crossover.examples) and is written as a
commented starter that validates; mistakes are one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from crossover.spec import parse_spec
from crossover.starter import DEFAULT_EXAMPLE, example_names, example_spec, example_text
from tests.helpers import SPECS


def init(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crossover", "init", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_every_spec_of_compose_specs_is_an_example() -> None:
    assert example_names() == sorted(p.stem for p in SPECS.glob("*.yaml"))
    assert DEFAULT_EXAMPLE in example_names()
    for name in example_names():
        assert example_text(name) == (SPECS / f"{name}.yaml").read_text()
    assert example_spec() == example_spec(DEFAULT_EXAMPLE)


@pytest.mark.parametrize("example", ["seed-70b-h100", "pd-8k-prompts", "cpu-real-vllm"])
def test_init_writes_a_commented_spec_that_validates(tmp_path: Path, example: str) -> None:
    args = ("spec.yaml", "--example", example) if example != DEFAULT_EXAMPLE else ()
    result = init(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    path = tmp_path / ("spec.yaml" if args else "fleet.yaml")
    text = path.read_text()
    guide = [line for line in text.splitlines() if line.startswith("#")]
    assert len(guide) > 15 and f"crossover validate {path.name}" in text
    parse_spec(yaml.safe_load(text))  # the comments change nothing
    validate = subprocess.run([sys.executable, "-m", "crossover", "validate", path.name], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
    assert validate.returncode == 0, validate.stderr


def test_list_names_every_example(tmp_path: Path) -> None:
    result = init(tmp_path, "--list")
    assert result.returncode == 0 and result.stdout.split() == example_names()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(("args", "expected"), [
    (("taken.yaml",), "taken.yaml: exists already; pass --force to overwrite it"),
    (("x.yaml", "--example", "nope"), "--example: no example named 'nope'"),
    ((".",), ".: is a folder"),
    (("missing/x.yaml",), "missing/x.yaml: cannot write"),
])
def test_mistakes_are_one_line(tmp_path: Path, args: tuple[str, ...], expected: str) -> None:
    (tmp_path / "taken.yaml").write_text("mine")
    result = init(tmp_path, *args)
    assert result.returncode == 2, result
    assert result.stderr.startswith(f"crossover init: {expected}") and result.stderr.count("\n") == 1
    assert (tmp_path / "taken.yaml").read_text() == "mine"


def test_force_overwrites(tmp_path: Path) -> None:
    (tmp_path / "fleet.yaml").write_text("old")
    assert init(tmp_path, "--force").returncode == 0
    assert (tmp_path / "fleet.yaml").read_text().startswith("# A vllm-crossover fleet spec")
