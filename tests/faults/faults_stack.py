"""A real Prometheus and a real Alertmanager for the fault tests (crossover.rules.prom's), each on a
free loopback port with a temporary folder, always stopped at the end of the `with` block; missing
binaries skip locally and fail under CI=true.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from crossover.rules import prom
from crossover.rules.prom import Daemon, PrometheusServer
from crossover.spec import parse_duration
from tests.helpers import REPO, require_binary

# What the compose stack's alertmanager service loads (tests/test_compose.py checks its mount).
SHIPPED_ALERTMANAGER = REPO / "compose" / "alertmanager" / "alertmanager.yml"


@contextmanager
def running_prometheus(config: Path) -> Iterator[PrometheusServer]:
    require_binary("prometheus")
    with prom.running_prometheus(config, start_timeout=60) as server:
        yield server


@contextmanager
def running_alertmanager(config: Path, port: int | None = None) -> Iterator[Daemon]:
    require_binary("prometheus-alertmanager")
    with prom.running_alertmanager(config, port) as server:
        yield server


def shipped_alertmanager_config(webhook_url: str) -> str:
    """The compose stack's Alertmanager configuration with its one webhook URL pointed at
    `webhook_url`, nothing else changed: the routes, grouping, timings and inhibition users get."""
    text = SHIPPED_ALERTMANAGER.read_text()
    urls = [h["url"] for r in yaml.safe_load(text)["receivers"] for h in r.get("webhook_configs", [])]
    assert len(urls) == 1 and text.count(urls[0]) == 1, urls
    return text.replace(urls[0], webhook_url)


def longest(route: dict[str, Any], key: str) -> float:
    """Seconds of the longest `key` (group_wait, group_interval) in an Alertmanager route tree."""
    own = [route[key]] if key in route else []
    values = [0.0 if v.strip().rstrip("smhdwy") == "0" else parse_duration(v) for v in own]
    return max([*values, *(longest(child, key) for child in route.get("routes", []))], default=0.0)
