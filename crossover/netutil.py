"""URL and loopback helpers shared by the spec, the command lines, the simulator, the demo and the tests."""

from __future__ import annotations

import contextlib
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:  # the spec checks its URLs with check_http_url: no import back at run time
    from crossover.spec import FleetSpec


def check_http_url(value: str) -> str:
    """A plain http(s)://host[:port] URL without its trailing slash, or a ValueError saying what is wrong
    (the caller names the field or flag)."""
    parts = urlsplit(value.strip())
    try:
        port = parts.port
    except ValueError:  # not a number, or out of range
        port = 0
    if port == 0:
        raise ValueError(f"malformed URL {value!r} (bad port)")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"malformed URL {value!r} (want http://host:port)")
    return value.strip().rstrip("/")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free right now on host (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """`count` distinct TCP ports free right now on host: each stays bound until all are picked,
    since the OS may hand a port just released by free_port to the next caller."""
    with contextlib.ExitStack() as held:
        sockets = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP port on host can be listened on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _with_port(url: str, port: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, f"{parts.hostname}:{port}", parts.path, parts.query, parts.fragment))


def spec_on_free_ports(spec: FleetSpec) -> FleetSpec:
    """The same spec with every instance and entrypoint URL moved to a free loopback port, so that
    tests and demos never collide with each other or with a fleet already running."""
    data = spec.model_dump(mode="json")
    wanted = sum(len(t["instances"]) + bool(t["entrypoint"].get("url")) for t in data["topologies"])
    ports = iter(free_ports(wanted))
    for topology in data["topologies"]:
        for instance in topology["instances"]:
            instance["url"] = _with_port(instance["url"], next(ports))
        entrypoint = topology["entrypoint"]
        if entrypoint.get("url"):
            old = entrypoint["url"]
            entrypoint["url"] = _with_port(old, next(ports))
            # A router's metrics served by the router itself (crossover's proxy) move with it.
            metrics = entrypoint.get("metrics_url")
            if metrics and urlsplit(metrics).netloc == urlsplit(old).netloc:
                entrypoint["metrics_url"] = _with_port(metrics, urlsplit(entrypoint["url"]).port or 80)
    return type(spec).model_validate(data)
