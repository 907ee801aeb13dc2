"""A real Prometheus and a real Alertmanager for the fault tests (crossover.rules.prom's), each on a
free loopback port with a temporary folder, always stopped at the end of the `with` block; missing
binaries skip locally and fail under CI=true.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from crossover.rules import prom
from crossover.rules.prom import Daemon, PrometheusServer
from tests.helpers import require_binary


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


def alertmanager_config(webhook_url: str, group_by: list[str]) -> dict[str, Any]:
    """Every alert to one webhook, fast: group_wait/group_interval of a second, resolved sent."""
    return {
        "route": {"receiver": "webhook", "group_by": group_by, "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1m"},
        "receivers": [{"name": "webhook",
                       "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
