"""What to scrape: the spec's instances plus optional Prometheus file_sd JSON files, and the pods
a Prometheus discovers on Kubernetes (`PrometheusSd`, mapped by the spec's kubernetes section).

A file_sd file is the JSON Prometheus reads for `file_sd_configs`:
`[{"targets": ["host:port", ...], "labels": {"topology": "...", "role": "...", "instance": "..."}}]`.
`topology` must name a topology of the spec (the target adds one instance of its tensor-parallel
size to it); `role` defaults to colocated; `instance` defaults to the address. `__scheme__` and
`__metrics_path__` labels are honoured as in Prometheus. Role `entrypoint` names a router's
metrics (no GPUs), read in the dialect detected from what it serves: the topology's user-facing
figures come from it.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from crossover.errors import UserError
from crossover.kube import pod_targets
from crossover.spec import ENTRYPOINT_ROLE, FleetSpec, Role, Target, spec_targets


def parse_file_sd(text: str, spec: FleetSpec, source: str) -> list[Target]:
    """Targets of one file_sd document; UserError with a one-line message naming the file."""
    try:
        groups = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{source}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(groups, list):
        raise UserError(f"{source}: the top level must be a list of target groups")
    topologies = {t.name: t for t in spec.topologies}
    roles = {*(r.value for r in Role), ENTRYPOINT_ROLE}
    out: list[Target] = []
    for index, group in enumerate(groups):
        where = f"{source}: group {index}"
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise UserError(f"{where}: needs a 'targets' list")
        labels = group.get("labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise UserError(f"{where}: 'labels' must map names to strings")
        topology = topologies.get(labels.get("topology", ""))
        if topology is None:
            raise UserError(f"{where}: label topology must name a spec topology "
                            f"(one of {sorted(topologies)}), got {labels.get('topology')!r}")
        role = labels.get("role", Role.COLOCATED.value)
        if role not in roles:
            raise UserError(f"{where}: label role must be one of {sorted(roles)}, got {role!r}")
        scheme = labels.get("__scheme__", "http")
        path = labels.get("__metrics_path__", "/metrics")
        for address in group["targets"]:
            if not isinstance(address, str) or not address or "/" in address:
                raise UserError(f"{where}: target {address!r} is not host:port")
            url = f"{scheme}://{address}{path if path.startswith('/') else '/' + path}"
            parts = urlsplit(url)
            try:
                parts.port  # noqa: B018 - raises on a bad port
            except ValueError:
                raise UserError(f"{where}: target {address!r} has a bad port") from None
            if not parts.hostname:
                raise UserError(f"{where}: target {address!r} is not host:port")
            instance = labels.get("instance", address)
            entry = role == ENTRYPOINT_ROLE
            out.append(Target(topology.name, instance, role, url,
                              0 if entry else topology.tp_for(instance, role),
                              split_by=tuple(topology.entrypoint.split_by) if entry else ()))
    return out


class FileSd:
    """file_sd files, re-read when their modification time or size changes. A file that becomes
    unreadable or invalid keeps its last good targets, and the reason is reported once."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = [Path(p) for p in paths]
        self._stamp: dict[Path, tuple[float, int] | None] = {}
        self._targets: dict[Path, list[Target]] = {}
        self.errors: dict[Path, str] = {}

    def refresh(self, spec: FleetSpec, force: bool = False) -> list[str]:
        """Re-read changed files; returns one message per problem found now."""
        problems: list[str] = []
        for path in self.paths:
            try:
                stat = os.stat(path)
                stamp: tuple[float, int] | None = (stat.st_mtime, stat.st_size)
            except OSError:
                stamp = None
            if not force and path in self._stamp and self._stamp[path] == stamp:
                continue
            self._stamp[path] = stamp
            try:
                if stamp is None:
                    raise UserError(f"{path}: no such file")
                self._targets[path] = parse_file_sd(path.read_text(encoding="utf-8"), spec, str(path))
                self.errors.pop(path, None)
            except (UserError, OSError, UnicodeDecodeError) as exc:
                message = str(exc) if isinstance(exc, UserError) else f"{path}: cannot read: {exc}"
                self.errors[path] = message
                problems.append(message + " (keeping its previous targets)")
        return problems

    def targets(self) -> list[Target]:
        return [t for path in self.paths for t in self._targets.get(path, [])]


def discovered_pods(body: Any, path: str) -> list[tuple[Mapping[str, str], str]]:
    """(discovered labels, metrics URL) of every target of a Prometheus `/api/v1/targets` answer,
    active and dropped alike: the pods are mapped by the spec's own relabelling, whatever job
    found them (a dropped target may be a pod of another port of ours, or one the user's job left
    out). The URL is the target's address with kubernetes.path."""
    data = body.get("data") if isinstance(body, dict) and body.get("status") == "success" else None
    if not isinstance(data, dict):
        raise UserError("not a Prometheus /api/v1/targets answer")
    out: list[tuple[Mapping[str, str], str]] = []
    for key in ("activeTargets", "droppedTargets"):
        for target in data.get(key) or []:
            labels = target.get("discoveredLabels") if isinstance(target, dict) else None
            if not isinstance(labels, dict) or not labels.get("__address__"):
                continue
            out.append((labels, f"{labels.get('__scheme__', 'http')}://{labels['__address__']}{path}"))
    return out


class PrometheusSd:
    """The pods a Prometheus discovers (its `GET /api/v1/targets`), re-read every `every_s`
    seconds so pods that come and go are followed without a restart. A failed read keeps the last
    good pods; each problem (the read, a pod that cannot be used) is reported once."""

    def __init__(self, url: str, every_s: float = 15.0, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._targets: list[Target] = []
        self._last = -math.inf
        self._reported: set[str] = set()

    async def refresh(self, session: aiohttp.ClientSession, spec: FleetSpec, now: float,
                      force: bool = False) -> list[str]:
        """Re-read when due; returns the problems not reported before."""
        if not force and now - self._last < self.every_s:
            return []
        self._last = now
        try:
            async with asyncio.timeout(self.timeout_s):
                async with session.get(f"{self.url}/api/v1/targets") as response:
                    if response.status != 200:
                        raise UserError(f"HTTP {response.status}")
                    body = await response.json(content_type=None)
            targets, problems = pod_targets(spec, discovered_pods(body, spec.kubernetes.path))
            self._targets = targets
        except (aiohttp.ClientError, TimeoutError, ValueError, UserError) as exc:
            problems = [f"{self.url}/api/v1/targets: {exc or type(exc).__name__} "
                        f"(keeping the {len(self._targets)} pods found before)"]
        new = [p for p in problems if p not in self._reported]
        self._reported = set(problems)  # a problem that goes away and comes back is said again
        return new

    def targets(self) -> list[Target]:
        return list(self._targets)


def all_targets(spec: FleetSpec, file_sd: FileSd | None, prometheus_sd: PrometheusSd | None = None
                ) -> list[Target]:
    """Spec targets first, then file_sd ones, then discovered pods; a duplicate (topology, instance)
    keeps the first, and so does a discovered pod whose URL is already a target (a listed instance
    that Prometheus also discovers is scraped once)."""
    seen: set[tuple[str, str]] = set()
    out: list[Target] = []
    given = spec_targets(spec) + (file_sd.targets() if file_sd else [])
    urls = {t.metrics_url for t in given}
    pods = [t for t in (prometheus_sd.targets() if prometheus_sd else []) if t.metrics_url not in urls]
    for target in given + pods:
        if target.key not in seen:
            seen.add(target.key)
            out.append(target)
    return out
