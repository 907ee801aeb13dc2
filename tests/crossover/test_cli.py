"""The one `crossover` command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from crossover import __version__
from crossover.cli import SUBCOMMANDS
from tests.helpers import REPO


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
    # pip puts the script beside the interpreter; PATH need not include the venv for this to hold.
    script = Path(sys.executable).parent / "crossover"
    assert script.is_file(), f"no crossover console script beside {sys.executable}"
    result = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == f"crossover {__version__}"


@pytest.mark.parametrize("generator", ["rules", "dashboards"])
def test_generators_refuse_an_out_that_is_a_file_in_one_line(tmp_path: Path, generator: str) -> None:
    spec = REPO / "compose" / "specs" / "seed-70b-h100.yaml"
    not_a_folder = tmp_path / "taken"
    not_a_folder.write_text("a file, not a folder")
    result = run(generator, str(spec), "--out", str(not_a_folder))
    assert result.returncode != 0
    assert result.stderr.strip() == f"crossover {generator}: --out: {not_a_folder} exists and is not a folder"
    below_a_file = not_a_folder / "dashboards"
    result = run(generator, str(spec), "--out", str(below_a_file))
    assert result.returncode != 0
    prefix = f"crossover {generator}: --out: cannot write into {below_a_file}: "
    assert result.stderr.strip().startswith(prefix)
    assert "\n" not in result.stderr.strip()


@pytest.mark.parametrize("generator", ["rules", "dashboards"])
def test_generators_write_into_a_new_nested_folder(tmp_path: Path, generator: str) -> None:
    out = tmp_path / "a" / "b"
    result = run(generator, str(REPO / "compose" / "specs" / "seed-70b-h100.yaml"), "--out", str(out))
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["validate", "SPEC"]])
def test_help_and_validate_import_no_heavy_library(argv: list[str]) -> None:
    """Only the module of the command being run is imported: `--help` and `validate` stay quick."""
    argv = [str(REPO / "compose" / "specs" / "seed-70b-h100.yaml") if a == "SPEC" else a for a in argv]
    probe = ("import sys\nfrom crossover.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
             "    pass\nheavy = [m for m in ('numpy', 'pandas', 'aiohttp', 'streamlit', 'scipy') "
             "if m in sys.modules]\nprint('HEAVY', heavy)\n")
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout, result.stdout[-500:]


def test_an_unknown_option_is_blamed_on_its_subcommand() -> None:
    result = run("validate", "spec.yaml", "--frobnicate")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr == ("crossover validate: error: unrecognized arguments: --frobnicate "
                             "(see crossover validate --help)\n")


@pytest.mark.parametrize(("argv", "expected"), [
    (("rules", "spec.yaml"), "crossover rules: error: the following arguments are required: --out"),
    (("rules", "spec.yaml", "--out", "x", "--format", "bogus"), "crossover rules: error: argument --format"),
    (("bogus",), "crossover: error: argument COMMAND: invalid choice: 'bogus'"),
])
def test_a_usage_mistake_is_one_line(argv: tuple[str, ...], expected: str) -> None:
    result = run(*argv)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert result.stderr.startswith(expected), result.stderr
