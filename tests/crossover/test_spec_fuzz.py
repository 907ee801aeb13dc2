"""Fuzz the spec loader: any input ends in a valid spec or one SpecError line, never a traceback."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crossover.spec import FleetSpec, SpecError, load_spec, parse_spec
from tests.helpers import SPECS

BASES = [yaml.safe_load((SPECS / name).read_text())
         for name in ("seed-70b-h100.yaml", "pd-8k-prompts.yaml", "cpu-real-vllm.yaml")]

leaves = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["http://127.0.0.1:1", "htp://x", "5s", "-1m", "30d", "nvlink", "prefill", "decode",
                     "round_robin", "", "0", "1e309", "http://[::1]:80", "http://host:70000"]),
)
values = st.recursive(leaves, lambda children: st.one_of(
    st.lists(children, max_size=4),
    st.dictionaries(st.text(max_size=12) | st.integers(), children, max_size=4)),
    max_leaves=12)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, child in node.items():
            out += paths(child, (*prefix, key))
    elif isinstance(node, list):
        for index, child in enumerate(node):
            out += paths(child, (*prefix, index))
    return out


@st.composite
def mutated_specs(draw: st.DrawFn) -> Any:
    spec = copy.deepcopy(draw(st.sampled_from(BASES)))
    for _ in range(draw(st.integers(1, 4))):
        targets = paths(spec)
        path = draw(st.sampled_from(targets))
        if not path:
            continue
        parent = spec
        for step in path[:-1]:
            parent = parent[step]
        action = draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(values)
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=10))] = draw(values)
        else:
            parent.append(draw(values))
    return spec


def assert_clean(outcome: Any) -> None:
    if isinstance(outcome, SpecError):
        message = str(outcome)
        assert message and "\n" not in message, repr(message)
        assert "Traceback" not in message
    else:
        assert isinstance(outcome, FleetSpec)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs())
def test_mutated_specs_load_or_fail_in_one_line(data: Any) -> None:
    try:
        outcome: Any = parse_spec(data, "fuzz.yaml")
    except SpecError as exc:
        outcome = exc
    assert_clean(outcome)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=400) | st.text(max_size=400).map(str.encode))
def test_arbitrary_bytes_fail_in_one_line(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "spec.yaml"
    path.write_bytes(payload)
    try:
        outcome: Any = load_spec(path)
    except SpecError as exc:
        outcome = exc
    assert_clean(outcome)
