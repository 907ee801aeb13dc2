from __future__ import annotations

from dataclasses import replace

import pytest

from crossover.app.form import SweepForm, build_request, check_slos, default_form
from crossover.errors import UserError
from crossover.loadgen.plan import LengthKind, Mode
from crossover.spec import load_spec
from tests.app.app_fixtures import SEED_SPEC


@pytest.fixture(scope="module")
def spec():
    return load_spec(SEED_SPEC)


def test_default_form_is_prefilled_from_the_spec(spec):
    form = default_form(spec)
    assert form.topologies == ["tp4x1", "tp2x2"]
    assert form.slos_ms == {"ttft": 2500.0, "tpot": 50.0, "itl": None, "e2el": None}
    assert form.objective == 0.99


def test_a_good_form_becomes_the_loadgen_plan(spec):
    form = replace(default_form(spec), topologies=["tp2x2", "tp4x1"], levels="16, 1,4",
                   requests_per_level=8, input_len="uniform:64-256", output_len="32",
                   slos_ms={"ttft": 1000.0, "tpot": 0.0, "itl": None, "e2el": None}, objective=0.95,
                   bootstrap=50)
    request = build_request(form, spec)
    assert request.topologies == ["tp4x1", "tp2x2"]  # the spec's order, whatever the user clicked
    assert request.plan.levels == (1.0, 4.0, 16.0)
    assert request.plan.mode is Mode.CLOSED
    assert request.plan.requests_per_level == 8
    assert request.plan.input_len.kind is LengthKind.UNIFORM and request.plan.input_len.high == 256
    assert request.plan.output_len.low == 32
    assert request.plan.slos_ms == {"ttft": 1000.0}  # 0 and None switch an SLO off
    assert request.plan.objective == 0.95
    assert request.n_boot == 50
    chat = build_request(replace(form, endpoint="chat", turns=5), spec)
    assert chat.plan.endpoint.value == "chat" and chat.plan.turns == 5
    with pytest.raises(UserError, match="Turns per conversation: a conversation needs the chat endpoint"):
        build_request(replace(form, turns=3), spec)
    with pytest.raises(UserError, match="Endpoint: unknown endpoint"):
        build_request(replace(form, endpoint="embeddings"), spec)


@pytest.mark.parametrize(("change", "message"), [
    ({"topologies": []}, "Topologies: pick at least one"),
    ({"topologies": ["tp8x1"]}, "not in the spec"),
    ({"levels": "1,two"}, "Concurrency levels: cannot read"),
    ({"levels": "1,2.5"}, "whole numbers"),
    ({"levels": "4,4"}, "duplicate"),
    ({"mode": "open", "levels": "0"}, "positive"),
    ({"requests_per_level": 0}, "Requests per level"),
    ({"input_len": "lots"}, "Input length: cannot read"),
    ({"output_len": "uniform:9-3"}, "low <= high"),
    ({"input_len": "8000", "output_len": "1000"}, "max_model_len 8192"),
    ({"slos_ms": {"ttft": 0.0, "tpot": None}}, "SLO invalid"),
    ({"slos_ms": {"ttft": -5.0}}, "positive number of ms"),
    ({"objective": 1.0}, "SLO objective"),
    ({"bootstrap": -1}, "Bootstrap resamples"),
])
def test_every_bad_field_is_one_line_naming_it(spec, change, message):
    form = replace(default_form(spec), **change)
    with pytest.raises(UserError) as caught:
        build_request(form, spec)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_open_loop_levels_are_rates(spec):
    form = SweepForm(topologies=["tp4x1"], mode="open", levels="0.5,1,2", requests_per_level=4,
                     slos_ms={"tpot": 50.0})
    plan = build_request(form, spec).plan
    assert plan.mode is Mode.OPEN and plan.levels == (0.5, 1.0, 2.0) and plan.axis == "rate"


def test_check_slos_keeps_only_those_switched_on():
    assert check_slos({"ttft": 2000.0, "tpot": 30.0, "itl": 0.0, "e2el": None}, 0.99) == {
        "ttft": 2000.0, "tpot": 30.0}


def test_adaptive_levels_take_the_levels_as_the_range(spec):
    form = replace(default_form(spec), levels="1,64", adaptive=True, target_ci=0.2)
    request = build_request(form, spec)
    assert request.adaptive is not None and request.adaptive.target_ci == 0.2
    assert request.first_levels == (1.0, 8.0)  # the low end and the log middle; more come as needed
    assert build_request(replace(form, adaptive=False), spec).first_levels == (1.0, 64.0)
    with pytest.raises(UserError, match=r"^Target interval width: must be a relative width between 0 and 1"):
        build_request(replace(form, target_ci=1.0), spec)
    with pytest.raises(UserError, match=r"^Adaptive levels: give the range"):
        build_request(replace(form, levels="8"), spec)
    with pytest.raises(UserError, match=r"^Bootstrap resamples: adaptive levels need intervals"):
        build_request(replace(form, bootstrap=0), spec)
