"""What to scrape: the spec's instances plus optional Prometheus file_sd JSON files.

A file_sd file is the JSON Prometheus reads for `file_sd_configs`:
`[{"targets": ["host:port", ...], "labels": {"topology": "...", "role": "...", "instance": "..."}}]`.
`topology` must name a topology of the spec (the target adds one instance of its tensor-parallel
size to it); `role` defaults to colocated; `instance` defaults to the address. `__scheme__` and
`__metrics_path__` labels are honoured as in Prometheus. Role `entrypoint` names a router's
vLLM-compatible metrics (no GPUs): the topology's user-facing figures come from it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import urlsplit

from crossover.errors import UserError
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
            out.append(Target(topology.name, instance, role, url,
                              0 if role == ENTRYPOINT_ROLE else topology.tp_for(instance, role)))
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


def all_targets(spec: FleetSpec, file_sd: FileSd | None) -> list[Target]:
    """Spec targets first, then file_sd ones; a duplicate (topology, instance) keeps the first."""
    seen: set[tuple[str, str]] = set()
    out: list[Target] = []
    for target in spec_targets(spec) + (file_sd.targets() if file_sd else []):
        if target.key not in seen:
            seen.add(target.key)
            out.append(target)
    return out
