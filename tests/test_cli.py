"""The one `crossover` command."""

from __future__ import annotations

import subprocess
import sys

from crossover import __version__
from crossover.cli import SUBCOMMANDS


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crossover", *args], capture_output=True, text=True,
                          timeout=60)


def test_version() -> None:
    result = run("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"crossover {__version__}"


def test_help_lists_every_subcommand() -> None:
    result = run("--help")
    assert result.returncode == 0
    for name in ("validate", "sim", "exporter", "sweep", "rules", "dashboards", "app", "demo"):
        assert name in SUBCOMMANDS
        assert name in result.stdout


def test_unknown_subcommand_fails_cleanly() -> None:
    result = run("frobnicate")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr


def test_installed_console_script_works() -> None:
    from shutil import which

    script = which("crossover")
    assert script is not None, "the crossover console script is not on PATH"
    result = subprocess.run([script, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
