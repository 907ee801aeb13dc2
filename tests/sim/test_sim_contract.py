"""The simulator's /metrics honours the same contract as a real vLLM server."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import running_fleet, with_overrides
from crossover.spec import load_spec
from devkit.contract import check_metrics_contract
from tests.helpers import FIXTURES, SPECS
from tests.outcomes import MEASURED, cut_stream, increase
from tests.sim.sim_client import get_text, post_json, stream


def _families(text: str) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _drive(url: str, model: str, n: int = 4) -> None:
    body = {"model": model, "prompt": "w1 w2 w3 w4 w5 w6 w7 w8", "max_tokens": 6, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda _: stream(url + "/v1/completions", body), range(n)))


def test_contract_holds_after_streamed_completions() -> None:
    spec = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml"))
    with running_fleet(spec):
        url = spec.topologies[1].instances[0].url
        _drive(url, spec.model.name)
        text = get_text(url + "/metrics")
    assert check_metrics_contract(text) == []
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[(catalog.GENERATION_TOKENS.name + "_total", None)] == 24
    assert samples[(catalog.PROMPT_TOKENS.name + "_total", None)] == 32
    assert samples[(catalog.REQUEST_SUCCESS.name + "_total", "length")] == 4
    assert samples[(catalog.TTFT.name + "_count", None)] == 4
    assert samples[(catalog.ITL.name + "_count", None)] == 20


def test_contract_check_catches_a_broken_payload() -> None:
    """The same check fails on a payload missing a family or carrying other buckets."""
    real = (FIXTURES / "vllm-0.32.0-after-requests.prom").read_text()
    dropped = "\n".join(line for line in real.splitlines() if catalog.TTFT.name not in line) + "\n"
    assert any(catalog.TTFT.name in p for p in check_metrics_contract(dropped))
    rebucketed = real.replace('le="0.001"', 'le="0.002"')
    assert any("buckets" in p for p in check_metrics_contract(rebucketed))


def test_same_families_and_label_sets_as_a_real_server() -> None:
    """Every catalog family a captured real vLLM 0.32 payload exposes, the simulator exposes with the
    same type, label names and `le` values; and both write the same sample suffixes."""
    real = _families((FIXTURES / "vllm-0.32.0-after-requests.prom").read_text())
    spec = spec_on_free_ports(load_spec(SPECS / "cpu-real-vllm.yaml"))
    with running_fleet(spec):
        url = spec.topologies[0].instances[0].url
        _drive(url, spec.model.name, 2)
        simulated = _families(get_text(url + "/metrics"))
    for metric in catalog.CATALOG.metrics:
        if metric.name not in real:
            continue
        ours, theirs = simulated.get(metric.name), real[metric.name]
        assert ours is not None, metric.name
        assert ours.type == theirs.type, metric.name  # type: ignore[attr-defined]
        def shape(family: object) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
            return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name")))
                    for s in family.samples}  # type: ignore[attr-defined]
        assert shape(ours) == shape(theirs), metric.name


@pytest.mark.parametrize(("version", "current", "legacy"), [
    ("0.10.2", False, True), ("0.11.0", True, True), ("0.32.0", True, False)])
def test_version_switch_emits_legacy_names(version: str, current: bool, legacy: bool) -> None:
    spec = spec_on_free_ports(with_overrides(load_spec(SPECS / "seed-70b-h100.yaml"), vllm_version=version))
    with running_fleet(spec):
        text = get_text(spec.topologies[0].instances[0].url + "/metrics")
    names = _families(text)
    for metric in (catalog.KV_CACHE_USAGE, catalog.ITL, catalog.PREFIX_CACHE_HITS):
        assert (metric.name in names) is current, (version, metric.name)
        assert (metric.aliases[0] in names) is legacy, (version, metric.aliases[0])
    assert catalog.TTFT.name in names  # never renamed
    # Checked in 0.32.0 (catalog.REQUEST_NUM_PREEMPTIONS_SINCE): served from there on only.
    assert (catalog.REQUEST_NUM_PREEMPTIONS.name in names) is (version == "0.32.0")


def test_a_finished_request_observes_its_preemptions() -> None:
    """catalog.REQUEST_NUM_PREEMPTIONS observes each finished request's own count (0 when never
    preempted), in vLLM's buckets."""
    from crossover.sim.metrics import InstanceMetrics, QueueState, render

    metrics = InstanceMetrics("m", 4096, lambda: QueueState(0, 0, 0, 0.0, 0))
    for preemptions in (0, 0, 2):
        metrics.on_finished(reason="stop", arrival=0.0, scheduled=0.1, first_token=0.2, last_token=0.5,
                            prompt_tokens=8, generated=4, preemptions=preemptions)
    family = _families(render(metrics).decode())[catalog.REQUEST_NUM_PREEMPTIONS.name]
    samples = {(s.name, s.labels.get("le")): s.value for s in family.samples}  # type: ignore[attr-defined]
    assert samples[(family.name + "_count", None)] == 3  # type: ignore[attr-defined]
    assert samples[(family.name + "_sum", None)] == 2  # type: ignore[attr-defined]
    assert samples[(family.name + "_bucket", "1.0")] == 2  # type: ignore[attr-defined]
    assert samples[(family.name + "_bucket", "2.0")] == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("outcome", ["bad_input", "cut_stream", "engine_error"])
def test_failures_are_counted_as_the_real_server_counts_them(outcome: str) -> None:
    """A bad request, a stream its client cuts and an engine error move the same counters as on
    vLLM 0.32 (tests/outcomes.py); admission rejections are exposed at zero (no queue limit)."""
    spec = spec_on_free_ports(load_spec(SPECS / "cpu-real-vllm.yaml"))
    with running_fleet(spec):
        url = spec.topologies[0].instances[0].url
        before = get_text(url + "/metrics")
        body = {"model": spec.model.name, "prompt": "w1 w2 w3 w4", "max_tokens": 4}
        if outcome == "bad_input":
            status, _ = post_json(url + "/v1/completions", {**body, "model": "nope"})
            assert status == 404
        elif outcome == "cut_stream":
            cut_stream(url, spec.model.name)
        else:
            post_json(url + "/admin/faults", {"error_rate": 1.0})
            status, _ = post_json(url + "/v1/completions", body)
            assert status == 500
        after = get_text(url + "/metrics")
    assert increase(before, after) == MEASURED[outcome]
    assert {(s.labels["reason"], s.value) for f in text_string_to_metric_families(after) for s in f.samples
            if s.name == catalog.ADMISSION_REJECTIONS.name + "_total"} == {
        (r, 0.0) for r in catalog.ADMISSION_REJECTION_REASONS}
