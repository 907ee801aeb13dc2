"""Before a sweep starts: can every target of the chosen topologies be reached at all?

A sweep against a server that is down would otherwise run every level to a table of failures.
A TCP connect is enough to tell "down" from "up"; what the server answers is the sweep's business.
The targets are exactly those loadgen will send traffic to (the spec's entrypoints or instances).
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from crossover.loadgen.sweep import topology_info
from crossover.spec import FleetSpec


def _reach(url: str, timeout_s: float) -> str | None:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except TimeoutError:
        return "no answer"
    except OSError as exc:
        return exc.strerror or type(exc).__name__


def unreachable_targets(spec: FleetSpec, topologies: Sequence[str], timeout_s: float = 1.0) -> list[str]:
    """One line per target that refuses or does not answer, naming its topology and URL."""
    targets = [(name, url) for name in topologies for url in topology_info(spec.topology(name)).targets]
    if not targets:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        problems = list(pool.map(lambda target: _reach(target[1], timeout_s), targets))
    return [f"target down: {name} at {url} ({problem})"
            for (name, url), problem in zip(targets, problems, strict=True) if problem]
