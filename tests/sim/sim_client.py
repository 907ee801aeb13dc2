"""Small blocking HTTP helpers for the simulator tests (stdlib only, loopback)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def post_json(url: str, body: Any, timeout: float = 30) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def stream(url: str, body: Any, timeout: float = 30) -> list[dict[str, Any]]:
    """POST a streaming request and return the parsed SSE events (without [DONE])."""
    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    done = False
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                events.append(json.loads(line[len("data: "):]))
    assert done, "stream ended without data: [DONE]"
    return events


def get_text(url: str, timeout: float = 30) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def get_json(url: str, timeout: float = 30) -> Any:
    return json.loads(get_text(url, timeout))


def stream_timed(url: str, body: Any, timeout: float = 30) -> list[tuple[float, dict[str, Any]]]:
    """Like stream(), with the monotonic time each event line was read."""
    import time

    request = urllib.request.Request(url, data=json.dumps({**body, "stream": True}).encode(),
                                     headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(request, timeout=timeout) as response:
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append((time.monotonic(), json.loads(line[len("data: "):])))
    return events
