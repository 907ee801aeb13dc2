"""The rules model: SLO buckets, burn tiers, le matching, naming, CLI errors (no external binaries)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from crossover import catalog
from crossover.cli import main
from crossover.errors import UserError
from crossover.rules import names
from crossover.rules.alerts import WATCHED_FAMILIES
from crossover.rules.buckets import le_regex, le_spellings, slo_buckets
from crossover.rules.generate import Format, outputs
from crossover.rules.model import RulesConfig, build_rules
from crossover.rules.names import (
    BURN_ALERT,
    REPLICA_LEVEL,
    ROLE_LEVEL,
    SLI_ERROR_PREFIX,
    api_requests_name,
    attainment_name,
    failed_requests_name,
    finished_by_reason_name,
    good_requests_name,
    quantile_name,
    rate_name,
    requests_name,
    requests_source_name,
    sli_error_name,
)
from crossover.rules.raw_series import promql_string
from crossover.rules.recording import RecordingRule
from crossover.spec import load_spec, parse_duration, parse_spec, spec_targets
from tests.helpers import SPECS

SEED = SPECS / "seed-70b-h100.yaml"
PD = SPECS / "pd-8k-prompts.yaml"


def _spec_data(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_burn_tiers_for_30_days_are_the_workbook_table() -> None:
    rules = build_rules(load_spec(SEED))
    table = [(t.long, t.short, t.factor, t.severity) for t in rules.tiers]
    assert table == [("1h", "5m", 14.4, "critical"), ("6h", "30m", 6.0, "critical"),
                     ("1d", "2h", 3.0, "warning"), ("3d", "6h", 1.0, "warning")]


def test_burn_factors_follow_the_period_and_objective() -> None:
    data = _spec_data(SEED)
    data["slos"]["period"] = "7d"
    data["slos"]["objective"] = 0.995
    rules = build_rules(parse_spec(data))
    # Windows scale with the period (7/30), so the factor stays share x period / long window.
    first = rules.tiers[0]
    assert first.long_s == round(3600 * 7 / 30)
    assert first.factor == pytest.approx(0.02 * 7 * 86400 / first.long_s, rel=1e-6)
    burn = next(a for a in rules.alerts if a.alert == BURN_ALERT)
    assert f"({first.factor!r} * 0.005)" in burn.expr


def test_window_scale_gives_a_test_profile_that_fires_within_minutes() -> None:
    rules = build_rules(load_spec(SEED), RulesConfig(window_scale=1 / 1440))  # 30d -> 30m
    assert rules.period == "30m"
    assert max(t.long_s for t in rules.tiers) <= 300
    assert max(a.for_s for a in rules.alerts) <= 60
    # Never below four scrapes, so rate() always has two samples.
    assert min(t.short_s for t in rules.tiers) >= 4 * 5


def test_unreachable_burn_threshold_is_a_warning() -> None:
    data = _spec_data(SEED)
    data["slos"]["objective"] = 0.9  # 14.4 x 10% is over 100% errors; 6 x 10% is not
    rules = build_rules(parse_spec(data))
    assert sum("can never fire" in w for w in rules.warnings) == 1
    assert len(rules.tiers) == 4


def test_le_spellings_cover_prometheus_2_and_3_and_parse_back() -> None:
    assert {"1.0", "1"} <= set(le_spellings(1.0))
    assert "0.05" in le_spellings(0.05)
    assert {"8589934592.0", "8589934592"} <= set(le_spellings(float(2**33)))
    for value in (0.001, 0.05, 1.0, 2.5, 2560.0, float(2**33)):
        regex = re.compile(le_regex(value))
        assert all(float(s) == value and regex.fullmatch(s) for s in le_spellings(value))
        # The anchored regex must not match a neighbouring bucket.
        assert not regex.fullmatch(repr(value * 10))
        assert not regex.fullmatch(repr(value) + "1")


def test_on_boundary_slo_reads_that_bucket() -> None:
    buckets, warnings = slo_buckets(load_spec(SEED))
    assert warnings == ()
    assert {(b.slo, b.le, b.exact) for b in buckets} == {("ttft", 2.5, True), ("tpot", 0.05, True)}


def test_off_boundary_slo_rounds_to_the_stricter_neighbour_with_a_warning() -> None:
    buckets, warnings = slo_buckets(load_spec(PD), source="pd")
    ttft = next(b for b in buckets if b.slo == "ttft")
    assert (ttft.le, ttft.exact) == (1.0, False)  # 2000 ms lies between 1 s and 2.5 s: 1 s is stricter
    assert len(warnings) == 2 and "stricter neighbour" in warnings[0] and "2000 ms" in warnings[0]


def test_off_boundary_slo_is_refused_when_asked() -> None:
    with pytest.raises(UserError, match="not a bucket boundary"):
        slo_buckets(load_spec(PD), refuse_off_boundary=True)


def test_slo_below_the_first_bucket_is_refused() -> None:
    data = _spec_data(SEED)
    data["slos"]["ttft_ms"] = 0.5  # below the first TTFT bucket (1 ms)
    with pytest.raises(UserError, match="no stricter boundary"):
        slo_buckets(parse_spec(data))


def test_names_follow_level_metric_operations() -> None:
    rules = build_rules(load_spec(PD))
    names = rules.record_names
    assert "topology:vllm_generation_tokens:rate1m" in names
    assert "topology:vllm_time_to_first_token_seconds:p99_1m" in names
    assert "topology:vllm_attainment_tpot:ratio_rate5m" in names
    assert "topology:vllm_attainment:ratio_lower_rate5m" in names
    assert "topology:vllm_goodput_requests:rate5m" in names
    assert "topology:vllm_failed_requests:rate5m" in names
    for name in names:
        assert re.fullmatch(r"[a-z_]+:[a-z0-9_]+:[a-z0-9_]+", name), name
        assert "_total" not in name


def test_attainment_is_good_over_all_requests_and_sums_before_dividing() -> None:
    rules = build_rules(load_spec(PD))
    exprs = {r.record: r.expr for r in rules.records}
    checked = 0
    for rule in rules.records:
        level = rule.record.split(":")[0]
        if ":ratio_rate" in rule.record and rule.record.split(":")[1].startswith("vllm_attainment_"):
            by = {"topology": "topology, model_name", "topology_role": "topology, role, model_name"}[level]
            window = rule.record.split("ratio_rate")[1]
            kind = rule.record.split(":")[1].removeprefix("vllm_attainment_")
            # failed requests count: good requests over every request the fleet should have served
            assert rule.expr == (f"{good_requests_name(kind, window, level)} / on ({by}) "
                                 f"{requests_name('all', window, level)}")
            good = exprs[good_requests_name(kind, window, level)]
            assert good.startswith(("avg_over_time(", "clamp_min(\n  sum by", "sum by")), good
            checked += 1
    assert checked > 20


RAW_RATE = re.compile(r"rate\(([a-z_]+:?[a-z_]+)(\{[^}]*\})?\[(\w+)\]\)")


def test_each_raw_rate_is_recorded_once_and_long_windows_read_recordings() -> None:
    """Sloth's way for big fleets: raw series are read over the short windows only, each (series,
    window) once; longer SLI windows average the recordings of a window at most 1/20 as long."""
    for spec in (PD, SPECS / "seed-70b-h100.yaml"):
        rules = build_rules(load_spec(spec))
        raw_windows = {*rules.dashboard_windows, rules.sli_windows[0]}
        seen: dict[str, str] = {}
        for rule in rules.records:
            for name, matchers, window in RAW_RATE.findall(rule.expr):
                assert window in raw_windows, (rule.record, name, window)
                key = f"{name}{matchers}[{window}]"
                assert seen.setdefault(key, rule.record) == rule.record, (key, seen[key], rule.record)
        for rule in rules.records:
            if rule.expr.startswith("avg_over_time("):
                source = re.search(r":rate(\w+)\[(\w+)\]\)$", rule.expr)
                assert source is not None, rule.expr
                short, long = (parse_duration(w) for w in source.groups())
                assert short <= max(long / 20, parse_duration(rules.sli_windows[0])), rule.expr


def test_groups_get_intervals_that_fit_their_windows() -> None:
    rules = build_rules(load_spec(SPECS / "seed-70b-h100.yaml"))
    intervals = {g.name: g.interval_s for g in rules.groups}
    assert intervals["crossover-topology"] == 15.0  # a quarter of the shortest window, 1m
    assert intervals["crossover-slo-windows"] == 60.0  # windows of 30m and more
    scaled = build_rules(load_spec(SPECS / "seed-70b-h100.yaml"), RulesConfig(window_scale=0.001))
    assert all(g.interval_s == scaled.spec.scrape.interval_seconds for g in scaled.groups)


def test_outcome_rules_fall_back_when_failure_families_are_absent() -> None:
    """No HTTP family: the finished and rejected requests; no admission family: no rejection; no
    failed finished_reason: 0 failed, not absent."""
    rules = build_rules(load_spec(PD))
    exprs = {r.record: r.expr for r in rules.records}
    finished = rate_name(catalog.REQUEST_SUCCESS, "5m")
    every = exprs[requests_name("all", "5m")]
    assert f"({rate_name(catalog.ADMISSION_REJECTIONS, '5m')} or 0 * {finished})" in every
    assert f"({requests_name('unfinished', '5m')} or 0 * {finished})" in every
    # unfinished requests over the longest raw window only: the HTTP counter lags the engine's
    assert requests_name("unfinished", "1m") not in exprs
    assert f"({requests_name('unfinished', '5m')} or" in exprs[requests_name("all", "1m")]
    failed = exprs[requests_name("failed_finished", "5m")]
    assert failed.endswith(f"or on (topology, model_name) 0 * {finished}")


def test_windows_cover_the_spec_and_the_alerts() -> None:
    rules = build_rules(load_spec(PD))
    assert {"1m", "5m", "30m", "1h", "2h", "6h", "1d", "3d", "30d"} == set(rules.sli_windows)
    errors = {r.record for r in rules.records if r.record.startswith(SLI_ERROR_PREFIX)}
    for tier in rules.tiers:
        assert sli_error_name(tier.long) in errors and sli_error_name(tier.short) in errors


def test_every_alert_has_severity_annotations_and_a_runbook_section() -> None:
    runbooks = (Path(__file__).resolve().parents[2] / "docs" / "runbooks.md").read_text()
    for spec_path in (SEED, PD):
        for alert in build_rules(load_spec(spec_path)).alerts:
            assert alert.severity in ("critical", "warning")
            assert alert.summary and alert.description
            anchor = alert.runbook_url.split("#", 1)[1]
            assert f"## {alert.alert}" in runbooks and anchor == alert.alert.lower()


def test_kv_transfer_alerts_only_for_disaggregated_fleets() -> None:
    assert "VllmKvTransferSlow" not in {a.alert for a in build_rules(load_spec(SEED)).alerts}
    pd_alerts = {a.alert for a in build_rules(load_spec(PD)).alerts}
    assert {"VllmKvTransferSlow", "VllmKvTransferFailures"} <= pd_alerts


def test_selector_is_applied_to_every_raw_series() -> None:
    rules = build_rules(load_spec(SEED), RulesConfig(selector='namespace="prod",job="vllm"'))
    raw = [r for r in rules.records if "rate(" in r.expr]
    assert raw and all('namespace="prod",job="vllm"' in r.expr for r in raw)


@pytest.mark.parametrize("selector", ["job=vllm", "", 'job="a" or 1', '{job="x"}'])
def test_bad_selector_is_one_line_error(selector: str) -> None:
    with pytest.raises(UserError, match="--selector"):
        RulesConfig(selector=selector)


def test_operator_resource_carries_the_same_groups_as_the_rule_file() -> None:
    spec = load_spec(PD)
    rules = build_rules(spec)
    files = outputs(spec, rules, Format.OPERATOR, "pd", "pd")
    resource = yaml.safe_load(files["prometheusrule.yaml"])
    plain = yaml.safe_load(files["promtool/rules.yml"])
    assert resource["kind"] == "PrometheusRule" and resource["apiVersion"] == "monitoring.coreos.com/v1"
    assert resource["spec"]["groups"] == plain["groups"]
    monitors = list(yaml.safe_load_all(files["podmonitor.yaml"]))
    assert [m["metadata"]["name"] for m in monitors] == ["vllm-crossover-pd-colocated",
                                                         "vllm-crossover-pd-pd1p1d"]
    for monitor in monitors:
        targets = {r.get("targetLabel") for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
        assert {"topology", "role", "gpus", "replica", "job"} <= targets
    # kubectl apply -f DIR reads every .yaml/.yml/.json at the folder's top: Kubernetes objects only.
    for name, text in files.items():
        if "/" not in name:
            assert all(doc.get("apiVersion") and doc.get("kind") for doc in yaml.safe_load_all(text)), name


def test_scrape_config_attaches_topology_role_and_gpus() -> None:
    spec = load_spec(PD)
    files = outputs(spec, build_rules(spec), Format.PLAIN, "pd", "pd")
    config = yaml.safe_load(files["prometheus.yml"])
    groups = config["scrape_configs"][0]["static_configs"]
    labels = {g["targets"][0]: g["labels"] for g in groups}
    assert labels["127.0.0.1:8311"] == {"topology": "pd1p1d", "role": "decode", "gpus": "1",
                                        "replica": "decode-0"}
    assert config["rule_files"] == ["rules.yml"]


def test_prometheus_scrapes_what_the_exporter_scrapes() -> None:
    """The scrape config's static groups are the spec's targets (crossover.spec.spec_targets), the
    exporter's list: same URLs, an https entrypoint on another path and an IPv6 instance included."""
    data = _spec_data(PD)
    data["topologies"][1]["entrypoint"]["metrics_url"] = "https://router.example:8443/vllm/metrics"
    data["topologies"][0]["instances"][0]["url"] = "http://[::1]:8300/colo"
    spec = parse_spec(data)
    config = yaml.safe_load(outputs(spec, build_rules(spec), Format.PLAIN, "pd", "pd")["prometheus.yml"])
    scraped = []
    for group in config["scrape_configs"][0]["static_configs"]:
        labels = group["labels"]
        scheme, path = labels.get("__scheme__", "http"), labels.get("__metrics_path__", "/metrics")
        scraped.append((labels["topology"], labels["replica"], labels["role"], int(labels["gpus"]),
                        f"{scheme}://{group['targets'][0]}{path}"))
    https = [s for s in scraped if s[4].startswith("https")]
    assert https == [("pd1p1d", "pd1p1d-entrypoint", "entrypoint", 0,
                      "https://router.example:8443/vllm/metrics")]
    assert scraped == [(t.topology, t.instance, t.role, t.gpus, t.metrics_url) for t in spec_targets(spec)]


def test_no_rule_names_a_metric_outside_the_catalog() -> None:
    known = {n for metric in catalog.CATALOG.metrics for n in metric.sample_names} | {"up"}
    for spec_path in (SEED, PD):
        rules = build_rules(load_spec(spec_path))
        exprs = [r.expr for r in rules.records] + [a.expr for a in rules.alerts]
        for expr in exprs:
            for name in re.findall(r"\b(vllm:[a-z0-9_]+)\{", expr):
                assert name in known, (expr, name)
        assert not rules.record_names & known


def test_cli_refuses_off_boundary_with_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["rules", str(PD), "--out", str(tmp_path), "--refuse-off-boundary"])
    err = capsys.readouterr().err
    assert code == 2 and "not a bucket boundary" in err and len(err.strip().splitlines()) == 1


def test_cli_warns_on_stderr_when_rounding(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["rules", str(PD), "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("warning:") == 2 and "stricter neighbour" in captured.err
    assert {p.name for p in tmp_path.iterdir()} == {"prometheus.yml", "rules.yml", "rules.test.yml"}


@pytest.mark.parametrize("argv, message", [
    (["--window-scale", "2"], "--window-scale"),
    (["--window-scale", "0"], "--window-scale"),
    (["--kv-transfer-p99-ms", "-1"], "--kv-transfer-p99-ms"),
    (["--selector", "nope"], "--selector"),
    (["--exporter-target", "nonsense"], "--exporter-target: 'nonsense' is not HOST:PORT"),
    (["--alertmanager", ":9093"], "--alertmanager: ':9093' is not HOST:PORT"),
    (["--alertmanager", "am:99999"], "is not HOST:PORT"),
    (["--format", "operator", "--alertmanager", "am:9093"], "only with --format plain"),
    (["--runbook-base", ""], "--runbook-base"),
    (["--runbook-base", "https://x/runbooks.md#top"], "--runbook-base"),
])
def test_cli_bad_flags(argv: list[str], message: str, capsys: pytest.CaptureFixture[str],
                       tmp_path: Path) -> None:
    assert main(["rules", str(SEED), "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_out_is_a_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["rules", str(SEED), "--out", str(target)]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_cli_accepts_host_port_forms(tmp_path: Path) -> None:
    assert main(["rules", str(SEED), "--out", str(tmp_path), "--exporter-target", "exporter:9400",
                 "--alertmanager", "[::1]:9093"]) == 0
    config = yaml.safe_load((tmp_path / "prometheus.yml").read_text())
    assert config["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"] == ["[::1]:9093"]
    assert config["scrape_configs"][1]["static_configs"][0]["targets"] == ["exporter:9400"]


def test_pd_fleets_record_request_figures_per_role() -> None:
    """A P/D request is one request on each role, so the topology level counts it twice; the
    per-role rules exist for P/D fleets only (colocated fleets keep their rule files unchanged)."""
    names = build_rules(load_spec(PD)).record_names
    assert {rate_name(catalog.REQUEST_SUCCESS, "1m", "topology_role"),
            quantile_name(catalog.TTFT, 0.99, "5m", "topology_role"),
            attainment_name("ttft", "1m", "topology_role")} <= names
    seed = build_rules(load_spec(SEED)).record_names
    assert not any(n.startswith("topology_role:") and ":rate" in n for n in seed)


def test_failures_per_replica_are_counted_as_per_topology_and_roles_sum_replicas() -> None:
    """Every fleet records failed requests per replica with the topology's formula (the dashboard's
    per-instance panel reads it), raw series over the shortest window and averages of it beyond, as
    per topology; a P/D fleet's per-role outcome rates are sums of the replicas' recordings of the
    same group, so the raw outcome families are read once per window."""
    for spec in (SEED, PD):
        rules = build_rules(load_spec(spec))
        exprs = {r.record: r.expr for r in rules.records}
        group = next(g for g in rules.groups if g.name == "crossover-replicas")
        order = [r.record for r in group.rules if isinstance(r, RecordingRule)]
        for window in rules.dashboard_windows:
            replica = exprs[failed_requests_name(window, REPLICA_LEVEL)]
            topology = exprs[failed_requests_name(window)]
            assert replica == topology.replace("topology:", "topology_replica:").replace(
                "topology_finished_reason:", "topology_replica_finished_reason:")
            for name in (finished_by_reason_name(window, REPLICA_LEVEL),
                         rate_name(catalog.ADMISSION_REJECTIONS, window, REPLICA_LEVEL),
                         api_requests_name(window, REPLICA_LEVEL)):
                if window == rules.dashboard_windows[0]:  # raw over the shortest window only
                    assert "rate(" in exprs[name] and "sum by (topology, role, replica" in exprs[name]
                else:
                    base = name.replace(f"rate{window}", f"rate{rules.dashboard_windows[0]}")
                    assert exprs[name] == f"avg_over_time({base}[{window}])"
                if spec == PD:
                    role = name.replace(f"{REPLICA_LEVEL}:", f"{ROLE_LEVEL}:").replace(
                        f"{REPLICA_LEVEL}_", f"{ROLE_LEVEL}_")
                    assert exprs[role].startswith("sum by (topology, role, model_name") and \
                        exprs[role].endswith(f"({name})")
                    assert order.index(name) < order.index(role)


def test_a_family_is_present_by_one_series_in_the_source_choice_and_the_alerts() -> None:
    """A histogram shows by its `_count`, a counter by `_total`: the entrypoint request source and the
    alerts on missing families read the same series, so they cannot disagree on what is exposed."""
    assert catalog.TTFT.presence_name == f"{catalog.TTFT.name}_count"
    assert catalog.REQUEST_SUCCESS.presence_name == f"{catalog.REQUEST_SUCCESS.name}_total"
    assert catalog.KV_CACHE_USAGE.presence_name == catalog.KV_CACHE_USAGE.name
    rules = build_rules(load_spec(PD))
    exprs = {r.record: r.expr for r in rules.records}
    alerts = {a.alert: a.expr for a in rules.alerts}
    families = "|".join(re.escape(f.presence_name) for f in catalog.ENTRYPOINT_FAMILIES)
    entry = f'{{job="vllm",__name__=~{promql_string(families)},role="entrypoint"}}'
    assert entry in exprs[requests_source_name()] and entry in alerts["VllmEntrypointMetricsAbsent"]
    for family in WATCHED_FAMILIES:
        assert f'unless on (instance) {family.presence_name}{{job="vllm"}}' in alerts["VllmMetricsAbsent"]


def test_the_naming_examples_are_names_the_rules_record() -> None:
    """names.py's docstring shows the naming scheme by example; each example must stay a real name."""
    examples = re.findall(r"^\s+([a-z_]+:[a-z0-9_]+:[a-z0-9_]+)(?:\{[^}]*\})?\s", names.__doc__ or "", re.M)
    assert len(examples) == 4
    assert set(examples) <= build_rules(load_spec(PD)).record_names
