"""The ground package (`crossover/`) imports nothing from the parts built on it, and nothing shipped
imports the checkout's developer support (`devkit/`, `tests/`): read from the source's imports (ast), so
an import inside a function counts as much as one at the top of a module."""

from __future__ import annotations

import ast

from tests.helpers import PACKAGE_DIR, PACKAGE_DIRS, REPO

GROUND = REPO / "crossover"


def parts_above_ground() -> set[str]:
    """The subpackages that pyproject maps from their own folders: exporter, rules, ..., demo."""
    return {name for name in PACKAGE_DIR if name != "crossover"}


def imported_modules(source: str, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in `source`, the module `module`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the importing module's package
                package = module.rsplit(".", node.level)[0]
                base = f"{package}.{node.module}" if node.module else package
            else:
                base = node.module or ""
            # `from crossover import sim` imports a subpackage: name each imported name too.
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def upward_imports(source: str, module: str, above: set[str]) -> list[str]:
    return sorted({f"line {line}: {name}" for line, name in imported_modules(source, module)
                   if any(name == part or name.startswith(part + ".") for part in above)})


def test_the_ground_package_imports_nothing_above_it() -> None:
    above = parts_above_ground()
    assert {"crossover.sim", "crossover.exporter", "crossover.demo", "crossover.pdproxy"} <= above
    modules = sorted(GROUND.rglob("*.py"))
    assert len(modules) > 5
    offenders = {}
    for path in modules:
        module = "crossover." + ".".join(path.relative_to(GROUND).with_suffix("").parts)
        found = upward_imports(path.read_text(), module, above)
        if found:
            offenders[str(path.relative_to(REPO))] = found
    assert not offenders, f"the ground package imports upward: {offenders}"


def test_nothing_shipped_imports_the_developer_support() -> None:
    """devkit/ and tests/ are not in the wheel: an installed package importing them would fail."""
    offenders = {}
    for folder in PACKAGE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            found = upward_imports(path.read_text(), "crossover.x", {"devkit", "tests"})
            if found:
                offenders[str(path.relative_to(REPO))] = found
    assert not offenders, f"shipped modules import the developer support: {offenders}"


def test_upward_imports_are_seen_in_every_form() -> None:
    above = {"crossover.sim", "crossover.rules"}
    source = """
import crossover.sim.fleet
from crossover.rules.prom import die_with_parent
from crossover import sim
from . import rules
def later():
    from .sim import engine
import crossover.spec
from crossover import errors
"""
    assert upward_imports(source, "crossover.x", above) == [
        "line 2: crossover.sim.fleet", "line 3: crossover.rules.prom",
        "line 3: crossover.rules.prom.die_with_parent",
        "line 4: crossover.sim", "line 5: crossover.rules", "line 7: crossover.sim",
        "line 7: crossover.sim.engine"]


LOADGEN = REPO / "loadgen"


def offenders_in(folder: str, forbidden: str) -> dict[str, list[str]]:
    """Each module of loadgen/FOLDER that imports the package `crossover.loadgen.FORBIDDEN`."""
    found = {}
    for path in sorted((LOADGEN / folder).glob("*.py")):
        module = f"crossover.loadgen.{folder}.{path.stem}"
        hits = upward_imports(path.read_text(), module, {f"crossover.loadgen.{forbidden}"})
        if hits:
            found[path.name] = hits
    return found


def test_traffic_and_analysis_stay_apart() -> None:
    """The load generator's two halves meet only in the sweep and the CLI above them: traffic sends
    and times requests without reading the analysis, and the analysis reads records without sending."""
    assert len(list((LOADGEN / "traffic").glob("*.py"))) > 5
    assert len(list((LOADGEN / "analysis").glob("*.py"))) > 5
    assert offenders_in("traffic", "analysis") == {}
    assert offenders_in("analysis", "traffic") == {}
