"""Every fault switches on and off, through the admin endpoint, the Python API and the spec."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog
from crossover.netutil import spec_on_free_ports
from crossover.sim.fleet import SimFleet, running_fleet
from crossover.spec import Fault, FleetSpec, load_spec
from devkit.contract import check_metrics_contract
from tests.helpers import SPECS
from tests.sim.sim_client import get_json, get_text, post_json, stream, stream_timed

SPEC = load_spec(SPECS / "seed-70b-h100.yaml")


@pytest.fixture(scope="module")
def fleet() -> Iterator[tuple[SimFleet, FleetSpec]]:
    spec = spec_on_free_ports(SPEC)
    with running_fleet(spec) as running:
        yield running, spec


@pytest.fixture
def url(fleet: tuple[SimFleet, FleetSpec]) -> Iterator[str]:
    running, spec = fleet
    yield spec.topology("tp2x2").instances[0].url
    running.clear_faults()


def _body(spec: FleetSpec, max_tokens: int = 8) -> dict[str, object]:
    return {"model": spec.model.name, "prompt": "a b c d", "max_tokens": max_tokens, "ignore_eos": True}


def _set(url: str, **fields: object) -> dict[str, object]:
    status, body = post_json(url + "/admin/faults", fields)
    assert status == 200, body
    return body


def _metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in payload")


def _mean_itl(url: str, spec: FleetSpec) -> float:
    times = [t for t, e in stream_timed(url + "/v1/completions", _body(spec, 16)) if e["choices"]]
    return (times[-1] - times[0]) / (len(times) - 1)


def test_slowdown_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _, spec = fleet
    normal = _mean_itl(url, spec)
    assert _set(url, slowdown=4.0)["slowdown"] == 4.0
    slow = _mean_itl(url, spec)
    _set(url)
    assert slow == pytest.approx(4 * normal, rel=0.25)
    assert _mean_itl(url, spec) == pytest.approx(normal, rel=0.25)


def test_error_rate_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _, spec = fleet
    _set(url, error_rate=1.0)
    status, body = post_json(url + "/v1/completions", _body(spec))
    assert status == 500 and body["object"] == "error"
    _set(url, error_rate=0.0)
    status, body = post_json(url + "/v1/completions", _body(spec))
    assert status == 200 and body["usage"]["completion_tokens"] == 8


def test_drop_rate_cuts_streams_mid_way(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _, spec = fleet
    _set(url, drop_rate=1.0)
    with pytest.raises((http.client.IncompleteRead, ConnectionError, AssertionError, urllib.error.URLError)):
        stream(url + "/v1/completions", _body(spec, 32))
    _set(url, drop_rate=0.0)
    events = stream(url + "/v1/completions", _body(spec, 32))
    assert len([e for e in events if e["choices"]]) == 32


def test_stall_metrics_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _set(url, stall_metrics=True)
    with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
        get_text(url + "/metrics", timeout=0.5)
    _set(url, stall_metrics=False)
    assert check_metrics_contract(get_text(url + "/metrics", timeout=5)) == []


def test_malformed_metrics_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _set(url, malformed_metrics=True)
    with pytest.raises(ValueError):
        list(text_string_to_metric_families(get_text(url + "/metrics")))
    _set(url, malformed_metrics=False)
    assert check_metrics_contract(get_text(url + "/metrics")) == []


def test_truncated_metrics_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _set(url, truncated_metrics=True)
    with pytest.raises(http.client.IncompleteRead):
        get_text(url + "/metrics")
    _set(url, truncated_metrics=False)
    assert check_metrics_contract(get_text(url + "/metrics")) == []


def test_legacy_names_on_and_off(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _set(url, legacy_names=True)
    names = {f.name for f in text_string_to_metric_families(get_text(url + "/metrics"))}
    assert catalog.KV_CACHE_USAGE.aliases[0] in names and catalog.KV_CACHE_USAGE.name not in names
    assert catalog.ITL.aliases[0] in names and catalog.ITL.name not in names
    _set(url, legacy_names=False)
    names = {f.name for f in text_string_to_metric_families(get_text(url + "/metrics"))}
    assert catalog.KV_CACHE_USAGE.name in names and catalog.KV_CACHE_USAGE.aliases[0] not in names


def test_restart_resets_counters(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    _, spec = fleet
    post_json(url + "/v1/completions", _body(spec))
    generated = catalog.GENERATION_TOKENS.name + "_total"
    created = catalog.GENERATION_TOKENS.name + "_created"
    before = get_text(url + "/metrics")
    assert _metric(before, generated) > 0
    time.sleep(0.01)
    _set(url, restart=True)
    after = get_text(url + "/metrics")
    assert _metric(after, generated) == 0
    assert _metric(after, created) > _metric(before, created)
    assert get_json(url + "/admin/requests") == []
    post_json(url + "/v1/completions", _body(spec))
    assert _metric(get_text(url + "/metrics"), generated) == 8


def test_admin_rejects_bad_faults_with_one_line(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    for body, words in [({"slowdown": -1}, "slowdown"), ({"error_rate": 2}, "error_rate"),
                        ({"bogus": 1}, "bogus"), ({"restart": "yes"}, "restart")]:
        status, answer = post_json(url + "/admin/faults", body)
        assert status == 400 and words in answer["message"] and "\n" not in answer["message"]
    request = urllib.request.Request(url + "/admin/faults", data=b"{not json", method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=5)
    assert caught.value.code == 400
    assert get_json(url + "/admin/faults") == Fault().model_dump()


def test_python_api_sets_faults(fleet: tuple[SimFleet, FleetSpec], url: str) -> None:
    running, spec = fleet
    name = spec.topology("tp2x2").instances[0].name
    running.set_fault(name, Fault(error_rate=1.0))
    assert get_json(url + "/admin/faults")["error_rate"] == 1.0
    assert post_json(url + "/v1/completions", _body(spec))[0] == 500
    running.set_fault(name, Fault())
    assert post_json(url + "/v1/completions", _body(spec))[0] == 200
    running.restart(name)
    assert running.requests(name) == []


def test_faults_from_the_spec_apply_at_start() -> None:
    data = SPEC.model_dump(mode="json")
    data["simulator"]["faults"] = {"tp4-0": {"legacy_names": True, "error_rate": 1.0}}
    spec = spec_on_free_ports(FleetSpec.model_validate(data))
    with running_fleet(spec):
        url = spec.topology("tp4x1").instances[0].url
        assert get_json(url + "/admin/faults")["legacy_names"] is True
        assert post_json(url + "/v1/completions", _body(spec))[0] == 500
        names = {f.name for f in text_string_to_metric_families(get_text(url + "/metrics"))}
        assert catalog.KV_CACHE_USAGE.aliases[0] in names
        _set(url)
        assert post_json(url + "/v1/completions", _body(spec))[0] == 200
        other = spec.topology("tp2x2").instances[0].url
        assert json.dumps(get_json(other + "/admin/faults")) == json.dumps(Fault().model_dump())
