"""Shared by the exporter fault tests: specs with extra (bad) targets, and readers of what the
exporter serves (/metrics as samples, /api/v1/snapshot as JSON)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from crossover.netutil import spec_on_free_ports
from crossover.spec import FleetSpec, load_spec
from tests.helpers import FIXTURES, SPECS

# A real vLLM 0.32.0 /metrics payload: what a bad target serves once it "recovers".
HEALTHY_PAYLOAD = (FIXTURES / "vllm-0.32.0-under-load.prom").read_bytes()

Sample = tuple[str, dict[str, str], float]


def fleet_spec(bad: dict[str, str] | None = None, *, interval: str = "1s", timeout: str = "500ms",
               windows: tuple[str, ...] = ("6s",), extra_scrape: dict[str, Any] | None = None) -> FleetSpec:
    """seed-70b-h100.yaml on free ports, scraped fast, plus a topology "bad" with one instance
    per {name: url} of `bad` (e.g. paths of one loopback server, one path per fault)."""
    data = spec_on_free_ports(load_spec(SPECS / "seed-70b-h100.yaml")).model_dump(mode="json")
    data["scrape"].update({"interval": interval, "timeout": timeout, "windows": list(windows),
                           **(extra_scrape or {})})
    if bad:
        data["topologies"].append({
            "name": "bad", "gpus": 2 * len(bad), "tensor_parallel_size": 2,
            "instances": [{"name": name, "url": url} for name, url in bad.items()]})
    return FleetSpec.model_validate(data)


def get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def samples(url: str) -> list[Sample]:
    text = get(url + "/metrics").decode()
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]


def snapshot(url: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(get(url + "/api/v1/snapshot"))
    return document


def value(rows: list[Sample], name: str, **labels: str) -> float | None:
    found = [v for n, lab, v in rows if n == name and all(lab.get(k) == want for k, want in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


def up(rows: list[Sample], instance: str) -> float | None:
    return value(rows, "crossover_target_up", instance=instance)


def errors(rows: list[Sample], instance: str, reason: str) -> float:
    return value(rows, "crossover_scrape_errors_total", instance=instance, reason=reason) or 0.0


def group(document: dict[str, Any], topology: str, instance: str | None = None,
          window: str = "6s") -> dict[str, Any]:
    """A topology's (or one of its instances') derived figures for one window in the snapshot."""
    entry = next(t for t in document["topologies"] if t["name"] == topology)
    if instance is not None:
        entry = next(i for i in entry["instances"] if i["instance"] == instance)
    figures: dict[str, Any] = entry["windows"][window]
    return figures


def send_requests(urls: list[str], model: str, count: int, max_tokens: int = 8) -> int:
    """`count` streamed completions spread over urls (two at a time); returns how many finished."""
    import asyncio

    import aiohttp

    async def main() -> int:
        finished = 0
        semaphore = asyncio.Semaphore(2)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            async def one(index: int) -> None:
                nonlocal finished
                body = {"model": model, "prompt": "a b c d e f", "max_tokens": max_tokens,
                        "ignore_eos": True, "stream": True}
                async with semaphore, session.post(urls[index % len(urls)] + "/v1/completions",
                                                   json=body) as response:
                    payload = await response.read()
                    if response.status == 200 and payload.rstrip().endswith(b"[DONE]"):
                        finished += 1
            await asyncio.gather(*(one(i) for i in range(count)))
        return finished

    return asyncio.run(main())


def simulated_part(spec: FleetSpec) -> FleetSpec:
    """The spec without the "bad" topology: what the simulator serves (the bad targets are served
    by a test's own loopback server)."""
    data = spec.model_dump(mode="json")
    data["topologies"] = [t for t in data["topologies"] if t["name"] != "bad"]
    return FleetSpec.model_validate(data)
