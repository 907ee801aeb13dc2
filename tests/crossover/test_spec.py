"""The fleet spec loader and `crossover validate`: good specs load, bad ones give one line and exit 2."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from crossover import validate
from crossover.catalog import TTFT
from crossover.netutil import spec_on_free_ports
from crossover.slo import bucket_neighbours
from crossover.spec import FleetSpec, SpecError, load_spec, parse_duration, slo_warnings
from tests.helpers import FIXTURES, SPECS

EXAMPLES = sorted(SPECS.glob("*.yaml"))
BAD = sorted((FIXTURES / "bad-specs").glob("*.yaml"))


def crossover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "crossover", *args], capture_output=True, text=True,
                          timeout=60)


def test_the_three_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {"seed-70b-h100.yaml", "pd-8k-prompts.yaml", "cpu-real-vllm.yaml"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate(path: Path) -> None:
    spec = load_spec(path)
    assert spec.topologies
    result = crossover("validate", str(path))
    assert result.returncode == 0, result.stderr
    assert "ok" in result.stdout


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.stem)
def test_bad_specs_are_rejected_with_one_line(path: Path) -> None:
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value)
    result = crossover("validate", str(path))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_file_is_one_line() -> None:
    result = crossover("validate", "/nonexistent/spec.yaml")
    assert result.returncode == 2
    assert result.stderr.strip() == "crossover validate: /nonexistent/spec.yaml: no such file"


def test_off_boundary_slo_warns_with_neighbours() -> None:
    spec = load_spec(SPECS / "pd-8k-prompts.yaml")
    warnings = slo_warnings(spec, "pd")
    ttft = next(w for w in warnings if "ttft_ms" in w)
    assert "neighbours 1000 ms and 2500 ms" in ttft
    tpot = next(w for w in warnings if "tpot_ms" in w)
    assert "neighbours 25 ms and 50 ms" in tpot
    result = crossover("validate", str(SPECS / "pd-8k-prompts.yaml"))
    assert result.returncode == 0
    assert "warning:" in result.stderr and "ttft_ms" in result.stderr


def test_on_boundary_slo_gives_no_warning() -> None:
    assert slo_warnings(load_spec(SPECS / "seed-70b-h100.yaml")) == []


def test_bucket_neighbours_at_the_ends() -> None:
    assert bucket_neighbours(0.0005, TTFT.buckets) == (None, 0.001)
    assert bucket_neighbours(5000.0, TTFT.buckets) == (2560.0, None)


def test_kv_bytes_per_token_of_70b_is_320_kib() -> None:
    spec = load_spec(SPECS / "seed-70b-h100.yaml")
    assert spec.model.kv_bytes_per_token == 320 * 1024


@pytest.mark.parametrize(("text", "seconds"), [("500ms", 0.5), ("5s", 5), ("1m", 60), ("30d", 2592000)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_bearer_token_comes_from_env_and_never_from_the_spec(monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    text = (SPECS / "seed-70b-h100.yaml").read_text().replace(
        "scrape:\n", "scrape:\n  bearer_token_env: CROSSOVER_TEST_TOKEN\n")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    spec = load_spec(path)
    monkeypatch.delenv("CROSSOVER_TEST_TOKEN", raising=False)
    with pytest.raises(SpecError, match="CROSSOVER_TEST_TOKEN is not set"):
        spec.scrape.bearer_token()
    monkeypatch.setenv("CROSSOVER_TEST_TOKEN", "s3cret\n")
    assert spec.scrape.bearer_token() == "s3cret"
    assert "s3cret" not in repr(spec)


def test_free_ports_keep_everything_else() -> None:
    spec = load_spec(SPECS / "pd-8k-prompts.yaml")
    moved = spec_on_free_ports(spec)
    assert [t.name for t in moved.topologies] == [t.name for t in spec.topologies]
    old = {i.url for t in spec.topologies for i in t.instances}
    new = {i.url for t in moved.topologies for i in t.instances}
    assert not old & new
    assert moved.topologies[1].entrypoint.url != spec.topologies[1].entrypoint.url
    # the proxy's own metrics move with it
    assert moved.topologies[1].entrypoint.metrics_url == f"{moved.topologies[1].entrypoint.url}/metrics"


def test_each_topology_counts_its_requests_at_one_source(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Entrypoint metrics when the spec has them, else a P/D topology's decode role, else the
    instances; `crossover validate` names the source it reads."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    with_proxy = FleetSpec.model_validate(data)
    data["topologies"][1]["entrypoint"]["metrics_url"] = None
    without = FleetSpec.model_validate(data)
    assert [t.configured_requests_source for t in with_proxy.topologies] == ["instances", "entrypoint"]
    assert [t.configured_requests_source for t in without.topologies] == ["instances", "decode"]
    path = tmp_path / "spec.yaml"
    path.write_text((SPECS / "pd-8k-prompts.yaml").read_text().replace(
        ', metrics_url: "http://127.0.0.1:8319/metrics"', ""))
    assert validate.run(argparse.Namespace(spec=str(path), quiet=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].endswith("traffic to client-side round_robin")
    assert lines[2].endswith("; decode-side request figures (no entrypoint metrics)")


def test_readme_spec_table_names_every_field() -> None:
    """The README is the spec reference: a field added to the loader must appear there."""
    from pydantic import BaseModel

    import crossover.spec as spec_module
    from tests.helpers import REPO

    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("| section | fields"):readme.index("Errors are one line")]
    fields = {name for model in vars(spec_module).values()
              if isinstance(model, type) and issubclass(model, BaseModel)
              and model.__module__ == spec_module.__name__
              for name in model.model_fields}
    host_overheads = {f for f in fields if f.startswith("host_overhead_")}
    missing = sorted(f for f in fields - host_overheads if f"`{f}`" not in table and f"`{f}[]`" not in table)
    assert not missing, f"README's spec table lacks {missing}"
    assert host_overheads and "`host_overhead_*_us`" in table


@pytest.mark.parametrize(("where", "key", "hint"), [
    (("slos",), "tpot_msec", "did you mean tpot_ms?"),
    (("topologies", 0, "instances", 0), "rol", "did you mean role?"),
    (("simulator", "faults", "tp4-0"), "slowdwn", "did you mean slowdown?"),
    ((), "topology", "did you mean topologies?"),
    (("model",), "zzz", None),
])
def test_unknown_key_suggests_the_nearest_known_one(where: tuple[str | int, ...], key: str,
                                                    hint: str | None) -> None:
    import yaml

    from crossover.spec import parse_spec

    data = yaml.safe_load((SPECS / "seed-70b-h100.yaml").read_text())
    node = data
    for item in where:
        node = node.setdefault(item, {}) if isinstance(item, str) else node[item]
    node[key] = 1
    with pytest.raises(SpecError) as info:
        parse_spec(data, "s.yaml")
    message = str(info.value)
    assert f"{key}: unknown key" in message
    assert (hint in message) if hint else "did you mean" not in message
