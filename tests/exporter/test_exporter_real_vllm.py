"""The exporter on real vLLM CPU servers (the lead's session fixture): after streamed traffic,
every series a colocated fleet can have is present and finite, at topology and instance level.
(The offline counterpart on captured payloads is in test_exporter_derive.py.)"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
import pytest

from crossover.exporter.collector import derived_rows
from crossover.exporter.names import DERIVED_SERIES
from crossover.exporter.service import Exporter
from tests.exporter.exporter_traffic import send

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

# What a colocated vLLM server cannot have: NIXL transfers (P/D only).
NOT_COLOCATED = {s.suffix for s in DERIVED_SERIES if s.suffix.startswith("kv_transfer")}


@pytest.mark.slow
def test_every_colocated_series_present_and_finite_on_real_vllm(real_vllm_fleet: Any) -> None:
    spec = real_vllm_fleet.spec

    async def scenario() -> Any:
        exporter = Exporter(spec)
        async with aiohttp.ClientSession() as session:
            start = time.time()
            first = await exporter.cycle(session, now=start)
            assert all(t.up for t in first.targets), [t.last_error for t in first.targets]
            for topology in spec.topologies:
                await send([i.url for i in topology.instances], spec.model.name, 8, concurrency=4,
                           prompt_tokens=(8, 16), max_tokens=8)
            return await exporter.cycle(session, now=start + 30.0)

    snapshot = asyncio.run(scenario())
    expected = {s.suffix for s in DERIVED_SERIES} - NOT_COLOCATED
    for view in (*snapshot.topologies, *snapshot.instances):
        for window, derived in view.windows.items():
            rows = list(derived_rows(derived))
            present = {suffix for suffix, _, _ in rows}
            assert expected <= present, (view.topology, view.instance, window, expected - present)
            bad = [(suffix, extra, value) for suffix, extra, value in rows if not math.isfinite(value)]
            assert not bad, (view.topology, view.instance, window, bad)
            assert derived.generation_tokens_per_second and derived.generation_tokens_per_second > 0
