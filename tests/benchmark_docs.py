"""docs/performance.md read as data: one section per benchmark script in benchmarks/, each naming the
command that made its figures, its `--smoke` command and the keys of its `figures:` line (the line
benchmarks/figures.py prints). tests/test_docs_paths.py checks the sections; tests/test_benchmarks.py
runs each smoke and checks its figures against them."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tests.helpers import REPO

PERFORMANCE = REPO / "docs" / "performance.md"
BENCHMARKS = REPO / "benchmarks"
# Scripts that a benchmark launches, covered by that benchmark's section and smoke: script -> benchmark.
HELPERS = {"soak_farm.py": "soak.py", "soak_probe.py": "soak.py"}
_COMMAND = re.compile(r"`((?:\.venv/bin/)?python3? benchmarks/([\w.]+\.py)\b[^`]*)`")
_KEYS_LINE = "- **`figures:` keys:**"
_KINDS = {"may be zero": "zero", "any sign": "signed"}


def benchmark_scripts() -> list[str]:
    """Every runnable script in benchmarks/ but the helpers a benchmark launches."""
    return sorted(path.name for path in BENCHMARKS.glob("*.py")
                  if "__main__" in path.read_text() and path.name not in HELPERS)


@dataclass
class Section:
    script: str  # the benchmark the heading names, e.g. bench_sim.py
    commands: list[tuple[str, str]] = field(default_factory=list)  # (command, the script it runs)
    keys: dict[str, list[str]] = field(default_factory=dict)  # positive / zero / signed -> dotted paths

    @property
    def smoke(self) -> str | None:
        found = [c for c, script in self.commands if script == self.script and "--smoke" in c.split()]
        return found[0] if found else None

    @property
    def full(self) -> list[str]:
        """The commands that made the section's figures (its own script, not --smoke)."""
        return [c for c, script in self.commands if script == self.script and "--smoke" not in c.split()]


def parse_keys(line: str) -> dict[str, list[str]]:
    """`- **`figures:` keys:** `a`, `b.*.c`; may be zero: `d`; any sign: `e`` as
    {"positive": [a, b.*.c], "zero": [d], "signed": [e]}."""
    keys: dict[str, list[str]] = {"positive": [], "zero": [], "signed": []}
    for number, part in enumerate(line.removeprefix(_KEYS_LINE).split(";")):
        kind = "positive"
        if number:
            label = part.split(":", 1)[0].strip()
            assert label in _KINDS, f"figures keys: unknown kind {label!r} (want {', '.join(_KINDS)})"
            kind, part = _KINDS[label], part.split(":", 1)[1]
        keys[kind] += re.findall(r"`([^`]+)`", part)
    return keys


def sections(text: str | None = None) -> dict[str, Section]:
    """The sections of docs/performance.md (`## Title: `benchmarks/NAME.py``), by script name."""
    text = PERFORMANCE.read_text() if text is None else text
    found: dict[str, Section] = {}
    for chunk in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = chunk.splitlines()[0]
        named = re.search(r"`benchmarks/([\w.]+\.py)`", heading)
        assert named, f"a section of docs/performance.md names no benchmark: {heading!r}"
        section = Section(named.group(1), [(m.group(1), m.group(2)) for m in _COMMAND.finditer(chunk)])
        # The keys' list item, its continuation lines (indented) joined to it.
        item = re.search(rf"^{re.escape(_KEYS_LINE)}.*(?:\n  +\S.*)*", chunk, re.M)
        if item:
            section.keys = parse_keys(" ".join(item.group(0).split()))
        found[section.script] = section
    return found


def defined_options(script: str) -> set[str]:
    """The options a benchmark script defines: the `"--name"` literals in its source, and
    `--smoke` where it takes the shared flag (benchmarks/figures.py)."""
    source = (BENCHMARKS / script).read_text()
    options = set(re.findall(r"""["'](--[\w-]+)["']""", source))
    if "add_smoke_flag(" in source:
        options |= set(re.findall(r"""["'](--[\w-]+)["']""", (BENCHMARKS / "figures.py").read_text()))
    return options


def command_options(command: str) -> list[str]:
    return [word.split("=", 1)[0] for word in command.split() if word.startswith("--")]


def figures_module(path: Path = BENCHMARKS / "figures.py") -> ModuleType:
    """benchmarks/figures.py, loaded from its file (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("benchmark_figures", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
