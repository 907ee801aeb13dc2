"""The generated rules, configs and unit tests pass promtool; the committed examples are current."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from crossover import catalog, slo
from crossover.rules import names
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


def test_promtool_unit_tests_pass_behind_llm_ds_router(tmp_path: Path) -> None:
    """The P/D example behind llm-d's router: its series relabelled into vLLM's entrypoint families
    (the scrape config carries the relabelling), its routed requests counted as served by the rules."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["entrypoint"].get("metrics_url"):
            topology["entrypoint"]["dialect"] = "llm-d"
    spec = parse_spec(data, "llm-d")
    for name, text in outputs(spec, build_rules(spec), Format.PLAIN, "llm-d", "llm-d").items():
        (tmp_path / name).write_text(text)
    result = _promtool("test", "rules", "rules.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    test_input = (tmp_path / "rules.test.yml").read_text()
    assert 'source="entrypoint"' in test_input and f'finished_reason="{slo.ROUTED_REASON}"' in test_input
    assert "metric_relabel_configs" in (tmp_path / "prometheus.yml").read_text()
    checked = _promtool("check", "config", "--syntax-only", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]


def test_a_routers_failed_requests_are_not_counted_as_served(tmp_path: Path) -> None:
    """llm-d's request counter holds its failed requests: 10 routed/s of which 2 failed are 8 served,
    2 error, 10 finished, and the failed reason is counted once (not 10 + 2)."""
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["entrypoint"].get("metrics_url"):
            topology["entrypoint"]["dialect"] = "llm-d"
    spec = parse_spec(data, "llm-d")
    rules = build_rules(spec)
    (tmp_path / "rules.yml").write_text(outputs(spec, rules, Format.PLAIN, "llm-d", "llm-d")["rules.yml"])
    window = spec.scrape.windows[0]
    entry = 'job="vllm",topology="pd1p1d",role="entrypoint",instance="e:1",replica="pd1p1d-entrypoint"'
    name = catalog.REQUEST_SUCCESS.promql_name
    by_reason = names.finished_by_reason_name(window)
    finished = names.rate_name(catalog.REQUEST_SUCCESS, window)
    test = {"rule_files": ["rules.yml"], "evaluation_interval": "1m", "tests": [{
        "interval": "15s",
        "input_series": [
            {"series": f'{name}{{{entry},finished_reason="{slo.ROUTED_REASON}"}}', "values": "0+150x40"},
            {"series": f'{name}{{{entry},finished_reason="error",error_code="ModelServerError"}}',
             "values": "0+30x40"},
        ],
        "promql_expr_test": [
            {"expr": f'{by_reason}{{topology="pd1p1d"}}', "eval_time": "8m",
             "exp_samples": [{"labels": f'{by_reason}{{finished_reason="stop",topology="pd1p1d"}}',
                              "value": 8},
                             {"labels": f'{by_reason}{{finished_reason="error",topology="pd1p1d"}}',
                              "value": 2}]},
            {"expr": f'{finished}{{topology="pd1p1d"}}', "eval_time": "8m",
             "exp_samples": [{"labels": f'{finished}{{topology="pd1p1d"}}', "value": 10}]},
        ]}]}
    (tmp_path / "routed.test.yml").write_text(yaml.safe_dump(test))
    result = _promtool("test", "rules", "routed.test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_the_rules_warn_when_a_dialects_buckets_lack_the_slo_bucket() -> None:
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["entrypoint"].get("metrics_url"):
            topology["entrypoint"]["dialect"] = "llm-d"
    data["slos"] = {"ttft_ms": 500, "tpot_ms": 100}  # 500 ms: vLLM's boundary, between llm-d's 400 and 600
    warnings = build_rules(parse_spec(data, "llm-d")).warnings
    assert len(warnings) == 1, warnings
    assert catalog.LLMD_TTFT.name in warnings[0] and "pd1p1d" in warnings[0] and "500 ms" in warnings[0]
    data["slos"] = {"ttft_ms": 1000, "tpot_ms": 100}  # on both bucket sets
    assert build_rules(parse_spec(data, "llm-d")).warnings == ()


@pytest.mark.parametrize("dialect", sorted(set(catalog.DIALECTS) - {catalog.VLLM_DIALECT.name}))
def test_every_dialects_scrape_config_passes_promtool(tmp_path: Path, dialect: str) -> None:
    data = load_spec(SPECS / "pd-8k-prompts.yaml").model_dump(mode="json")
    for topology in data["topologies"]:
        if topology["entrypoint"].get("metrics_url"):
            topology["entrypoint"]["dialect"] = dialect
    spec = parse_spec(data, dialect)
    for name, text in outputs(spec, build_rules(spec), Format.PLAIN, dialect, dialect).items():
        (tmp_path / name).write_text(text)
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    relabels = config["scrape_configs"][0]["metric_relabel_configs"]
    renamed = {r["replacement"] for r in relabels if r.get("target_label") == "__name__"}
    assert catalog.REQUEST_SUCCESS.promql_name in renamed
    # never an engine's series; the filters' mark dropped last
    assert all("entrypoint;pd1p1d;" in r["regex"] for r in relabels[:-1])
    assert relabels[-1]["action"] == "labeldrop"
    checked = _promtool("check", "config", "--syntax-only", "prometheus.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
