"""Every repository path that README.md and docs/*.md cite exists: in code spans and code blocks
(relative to the repository root) and in Markdown links (relative to the document)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.benchmark_docs import (
    BENCHMARKS,
    HELPERS,
    PERFORMANCE,
    benchmark_scripts,
    command_options,
    defined_options,
    sections,
)
from tests.helpers import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Endings that make a bare top-level name in code a path (`pyproject.toml`), not a word (`app`).
PATH_SUFFIXES = (".py", ".md", ".yml", ".yaml", ".toml", ".json", ".c", ".sh", ".png", ".txt", ".cfg")
_FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
_CODE = re.compile(r"`([^`\n]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_TOKEN = re.compile(r"^\.{0,2}/?[\w.*<>{}-]+(?:/[\w.*<>{}-]*)*$")
# Files the user makes from a committed template, which docs name on purpose.
USER_MADE = {"compose/.env"}


def tracked_top_level() -> set[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return {line.split("/")[0] for line in listed.splitlines()}


def code(text: str) -> list[str]:
    blocks = _FENCED.findall(text)
    return blocks + _CODE.findall(_FENCED.sub("", text))


def prose(text: str) -> str:
    return _CODE.sub("", _FENCED.sub("", text))


def cited_in_code(text: str, top_level: set[str]) -> list[str]:
    """Tokens of code that name a repository path: under a tracked top-level entry, or the entry
    itself (`pyproject.toml`). `path::test` and `path:line` cite the path; a path under a folder the
    repository does not have (`logs/pids.json` of a run's output) is not a repository path."""
    cited = []
    for span in code(text):
        for token in span.split():
            token = re.sub(r"(::\S*|:\d+(?:-\d+)?)$", "", token).rstrip(".,;:)")
            if token.startswith(("/", "~", "$", "http", "-")) or not _TOKEN.match(token):
                continue
            first = token.removeprefix("./").split("/")[0]
            if first in top_level and ("/" in token or token.endswith(PATH_SUFFIXES)):
                cited.append(token.removeprefix("./"))
    return cited


def cited_in_links(text: str) -> list[str]:
    return [target.split("#")[0] for target in _LINK.findall(prose(text))
            if not re.match(r"^[a-z]+:", target) and not target.startswith("#")]


def exists(base: Path, cited: str) -> bool:
    pattern = re.sub(r"<[^>]*>|\{[^}]*\}", "*", cited.rstrip("/"))
    if "*" in pattern:
        return any(base.glob(pattern))
    return (base / pattern).exists()


def missing_paths(doc: Path, top_level: set[str]) -> list[str]:
    text = doc.read_text()
    missing = [c for c in cited_in_code(text, top_level) if c not in USER_MADE and not exists(REPO, c)]
    missing += [link for link in cited_in_links(text) if link and not exists(doc.parent, link)]
    return missing


def test_every_cited_path_exists() -> None:
    top_level = tracked_top_level()
    missing = {str(doc.relative_to(REPO)): found for doc in DOCS if (found := missing_paths(doc, top_level))}
    assert not missing, f"docs cite paths that do not exist: {missing}"


def test_the_extractor_sees_the_forms_docs_use(tmp_path: Path) -> None:
    text = ("See `exporter/derive.py`, `tests/sim/test_sim_pd.py::test_x`, `rules/nowhere.py:12`, "
            "`python -m crossover.rules.generate`, `dashboards/generated/<stem>/*.json`, "
            "`crossover sweep SPEC --out results/run`, [the app](docs/app.md#flags), "
            "[site](https://example.com), `topologies[1](tp2x2)`, `logs/pids.json` and `pyproject.toml`.\n"
            "```\ncp compose/.env.example compose/nothing.yml\n```\n")
    top = {"exporter", "tests", "rules", "dashboards", "docs", "pyproject.toml"}
    top.add("compose")
    assert cited_in_code(text, top) == [
        "compose/.env.example", "compose/nothing.yml", "exporter/derive.py", "tests/sim/test_sim_pd.py",
        "rules/nowhere.py", "dashboards/generated/<stem>/*.json", "pyproject.toml"]
    assert cited_in_links(text) == ["docs/app.md"]
    (tmp_path / "doc.md").write_text(text)
    assert "rules/nowhere.py" in missing_paths(tmp_path / "doc.md", top)


def test_nothing_points_at_the_teams_shared_folder() -> None:
    """Users have no `shared` folder beside their checkout: what they need is in docs/."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    needles = ("shared/" + "reference", "../" + "shared", "/work/" + "shared")
    pointing = [path for path in listed.splitlines()
                if (REPO / path).is_file() and not path.endswith(".png")
                and any(n in (REPO / path).read_text(errors="replace") for n in needles)]
    assert not pointing, f"these files point at the team's shared folder: {pointing}"


def test_the_readme_lists_every_command() -> None:
    from crossover.cli import SUBCOMMANDS

    listed = set(re.findall(r"^\| `crossover ([a-z]+)", (REPO / "README.md").read_text(), re.M))
    assert listed == set(SUBCOMMANDS), (f"missing from README's table: {set(SUBCOMMANDS) - listed}; "
                                        f"not commands: {listed - set(SUBCOMMANDS)}")


def test_performance_has_one_section_per_benchmark_with_its_commands() -> None:
    """docs/performance.md is the benchmarks' manual: a section per benchmark script (`## ...:
    `benchmarks/NAME.py``), each with the command that made its figures, its `--smoke` command (which
    tests/test_benchmarks.py runs) and the keys of its `figures:` line; the summary table above them
    names every one; and every command there runs a script that exists with options it defines."""
    found = sections()
    scripts = benchmark_scripts()
    assert not set(scripts) - set(found), f"benchmarks without a section: {sorted(set(scripts) - set(found))}"
    assert not set(found) - set(scripts), f"sections of no benchmark: {sorted(set(found) - set(scripts))}"
    for helper, launcher in HELPERS.items():
        assert helper in (BENCHMARKS / launcher).read_text(), f"{launcher} no longer launches {helper}"
    summary = re.split(r"^## ", PERFORMANCE.read_text(), flags=re.M)[0]
    for name, section in found.items():
        assert name in summary, f"docs/performance.md: the summary table has no row for {name}"
        assert section.full, f"docs/performance.md, {name}: no command that made the figures"
        assert section.smoke == f"python benchmarks/{name} --smoke", \
            f"docs/performance.md, {name}: no smoke command `python benchmarks/{name} --smoke`"
        assert section.keys.get("positive"), f"docs/performance.md, {name}: no `figures:` keys"
        for command, script in section.commands:
            assert (BENCHMARKS / script).is_file(), f"docs/performance.md, {name}: `{command}`: no script"
            unknown = set(command_options(command)) - defined_options(script)
            assert not unknown, f"docs/performance.md, {name}: `{command}`: {script} has no {sorted(unknown)}"


def test_the_performance_checks_read_the_forms_the_manual_uses() -> None:
    text = ("# Performance\n\n| benchmark |\n|---|\n| `bench_x.py` |\n\n"
            "## X: `benchmarks/bench_x.py`\n\n"
            "- **Command:** `python benchmarks/bench_x.py --streams 8 --duration=3`, then "
            "`.venv/bin/python benchmarks/bench_y.py --fast`\n"
            "- **Smoke:** `python benchmarks/bench_x.py --smoke`\n"
            "- **`figures:` keys:** `a`, `b.*.c`; may be zero:\n  `d`; any sign: `e`,\n  `f`\n\n"
            "A table `g`.\n")
    section = sections(text)["bench_x.py"]
    assert section.full == ["python benchmarks/bench_x.py --streams 8 --duration=3"]
    assert section.smoke == "python benchmarks/bench_x.py --smoke"
    assert [script for _, script in section.commands] == ["bench_x.py", "bench_y.py", "bench_x.py"]
    assert section.keys == {"positive": ["a", "b.*.c"], "zero": ["d"], "signed": ["e", "f"]}
    assert command_options(section.full[0]) == ["--streams", "--duration"]
    assert {"--smoke", "--cycles"} <= defined_options("bench_exporter.py")


def test_code_cites_only_docs_that_exist() -> None:
    """A comment or docstring that sends the reader to a page under docs/ sends them somewhere real."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    sources = [path for path in listed.splitlines()
               if not path.startswith(("docs/", "tests/fixtures/")) and path != "README.md"
               and (REPO / path).is_file() and not path.endswith((".png", ".csv"))]
    cited = {(path, page) for path in sources
             for page in re.findall(r"\bdocs/[\w-]+\.md\b", (REPO / path).read_text(errors="replace"))}
    missing = sorted(f"{path}: {page}" for path, page in cited if not (REPO / page).exists())
    assert not missing, f"code cites docs that do not exist: {missing}"
