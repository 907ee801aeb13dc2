"""The generated rules, configs and unit tests pass promtool; the committed examples are current."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from crossover.rules.generate import PROMTOOL_DIR, Format, example_outputs, outputs
from crossover.rules.model import build_rules
from crossover.spec import load_spec, parse_spec
from tests.helpers import REPO, SPECS, require_binary

pytestmark = pytest.mark.prometheus
EXAMPLES = sorted(p.stem for p in SPECS.glob("*.yaml"))


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([require_binary("promtool"), *args], capture_output=True, text=True, timeout=120,
                          cwd=cwd, stdin=subprocess.DEVNULL)


def test_committed_examples_match_regeneration() -> None:
    stale = []
    for path, text in example_outputs(REPO).items():
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(str(path.relative_to(REPO)))
    assert not stale, f"regenerate with `python -m crossover.rules.generate`: {stale}"


@pytest.mark.parametrize("stem", EXAMPLES)
def test_promtool_checks_committed_rules_and_config(stem: str, tmp_path: Path) -> None:
    for rule_file in (REPO / "rules" / "generated" / stem / PROMTOOL_DIR / "rules.yml",
                      REPO / "compose" / "prometheus" / stem / "rules.yml"):
        result = _promtool("check", "rules", str(rule_file))
        assert result.returncode == 0, result.stdout + result.stderr
    config = REPO / "compose" / "prometheus" / stem / "prometheus.yml"
    data = yaml.safe_load(config.read_text())
    if any("kubernetes_sd_configs" in job for job in data["scrape_configs"]):
        # Debian's prometheus is built without Kubernetes discovery (promtool: "field
        # kubernetes_sd_configs not found"): check everything else with file_sd in its place.
        for job in data["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["file_sd_configs"] = [{"files": ["pods.json"]}]
        config = tmp_path / "prometheus.yml"
        config.write_text(yaml.safe_dump(data))
        rules = REPO / "compose" / "prometheus" / stem / "rules.yml"
        (tmp_path / "rules.yml").write_text(rules.read_text())
    result = _promtool("check", "config", str(config))
    assert result.returncode == 0, result.stdout + result.stderr


def _without_header(path: Path) -> str:
    return path.read_text().split("\n", 1)[1]


def _distinct_examples() -> list[str]:
    """One example per distinct (rules, unit test) pair: the compose-* specs differ from the others
    only in their URLs and header line, so promtool would run the very same test twice."""
    seen: dict[tuple[str, str], str] = {}
    for stem in EXAMPLES:
        folder = REPO / "rules" / "generated" / stem / PROMTOOL_DIR
        if (folder / "rules.test.yml").exists():
            key = (_without_header(folder / "rules.yml"), _without_header(folder / "rules.test.yml"))
            seen.setdefault(key, stem)
    return sorted(seen.values())


@pytest.mark.parametrize("stem", _distinct_examples())
def test_promtool_unit_tests_pass(stem: str) -> None:
    folder = REPO / "rules" / "generated" / stem / PROMTOOL_DIR
    result = _promtool("test", "rules", "rules.test.yml", cwd=folder)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    tests = yaml.safe_load((folder / "rules.test.yml").read_text())["tests"]
    fired = {a["alertname"] for t in tests for a in t["alert_rule_test"] if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests for a in t["alert_rule_test"] if not a["exp_alerts"]}
    assert {"VllmGoodputBudgetBurn", "VllmErrorBudgetExhausted", "VllmTargetDown",
            "VllmMetricsAbsent", "VllmTopologyAbsent"} <= fired
    assert {"VllmTargetDown", "VllmMetricsAbsent", "VllmTopologyAbsent"} <= quiet
    if any(t.disaggregated for t in load_spec(SPECS / f"{stem}.yaml").topologies):
        assert {"VllmKvTransferSlow", "VllmKvTransferFailures"} <= fired & quiet


def test_promtool_unit_test_fails_when_the_rules_are_wrong(tmp_path: Path) -> None:
    """The generated unit test is not vacuous: rules for a laxer objective must fail it."""
    data = yaml.safe_load((SPECS / "cpu-real-vllm.yaml").read_text())
    spec = parse_spec(data)
    honest = outputs(spec, build_rules(spec), Format.PLAIN, "x", "x")
    data["slos"]["objective"] = 0.6  # budget 40%: the 50%-bad topology burns far slower
    lax = outputs(parse_spec(data), build_rules(parse_spec(data)), Format.PLAIN, "x", "x")
    (tmp_path / "rules.yml").write_text(lax["rules.yml"])
    (tmp_path / "rules.test.yml").write_text(honest["rules.test.yml"])
    result = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "VllmGoodputBudgetBurn" in result.stdout + result.stderr


def test_cli_output_passes_promtool(tmp_path: Path) -> None:
    from crossover.cli import main

    assert main(["rules", str(SPECS / "seed-70b-h100.yaml"), "--out", str(tmp_path), "--window-scale",
                 "0.001", "--selector", 'job="vllm",env!="dev"']) == 0
    result = _promtool("check", "config", str(tmp_path / "prometheus.yml"))  # also checks rules.yml
    assert result.returncode == 0 and "SUCCESS" in result.stdout, result.stdout + result.stderr
    spec = load_spec(SPECS / "seed-70b-h100.yaml")
    assert build_rules(spec).period == "30d"


def test_promtool_unit_test_fails_when_topology_absent_is_blind(tmp_path: Path) -> None:
    """The undiscovered-fleet case is proven: rules whose VllmTopologyAbsent watches another
    job fail the generated unit test."""
    spec = load_spec(SPECS / "cpu-real-vllm.yaml")
    files = outputs(spec, build_rules(spec), Format.PLAIN, "x", "x")
    blind = files["rules.yml"].replace('absent(up{job="vllm",', 'absent(up{job="node",')
    assert blind != files["rules.yml"]
    (tmp_path / "rules.yml").write_text(blind)
    (tmp_path / "rules.test.yml").write_text(files["rules.test.yml"])
    result = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert result.returncode != 0 and "VllmTopologyAbsent" in result.stdout + result.stderr


@pytest.mark.parametrize("metrics_url", [True, False], ids=["entrypoint", "decode-side"])
def test_promtool_unit_tests_pass_with_mooncake_and_without_entrypoint_metrics(tmp_path: Path,
                                                                              metrics_url: bool) -> None:
    """The P/D example with its decode instance on the Mooncake connector (KV rules read either
    connector's families), with and without the proxy's metrics (the requests source falls back to
    the decode role, each request still counted once)."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    data["simulator"]["kv_connector"] = "mooncake"
    if not metrics_url:
        for topology in data["topologies"]:
            topology["entrypoint"].pop("metrics_url", None)
    spec = parse_spec(data, "mooncake")
    for name, text in outputs(spec, build_rules(spec), Format.PLAIN, "mooncake", "mooncake").items():
        (tmp_path / name).write_text(text)
    result = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    source = "entrypoint" if metrics_url else "decode"
    assert f'source="{source}"' in (tmp_path / "rules.test.yml").read_text()
