"""The exporter's state between cycles and the immutable Snapshot every reader sees.

`ExporterState` keeps, per target, its scrape history and health. After each cycle,
`build_snapshot` (a pure function of that state, the targets and the spec) derives every group
over every window; /metrics and /api/v1/snapshot read only the latest Snapshot.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from crossover.exporter.derive import (
    Derived,
    WindowSums,
    derive_many,
    derive_sums,
    exposes_requests,
    merge_rows,
    user_facing,
    window_rows,
)
from crossover.exporter.scrape import ERROR_REASONS, ScrapeResult
from crossover.exporter.window import History, SeriesWindow, label_values, only
from crossover.slo import (
    GOODPUT_REQUESTS,
    GOODPUT_TOKENS,
    TAIL_KINDS,
    TAIL_QUANTILE,
    percentile_column,
    quantile_label,
)
from crossover.spec import ENTRYPOINT_ROLE, FleetSpec, Role, Target, format_duration, requests_source


@dataclass
class TargetHealth:
    """One target's scrape record (mutable, owned by the scrape loop)."""

    target: Target
    history: History
    up: bool = False
    scrapes: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    last_duration: float | None = None
    last_success: float | None = None
    last_error: str | None = None
    body_bytes: int = 0

    def record(self, result: ScrapeResult, timestamp: float) -> None:
        self.scrapes += 1
        self.last_duration = result.duration
        if result.series is not None:
            self.up = True
            self.last_success = timestamp
            self.body_bytes = result.body_bytes
            self.history.add(timestamp, result.series)
        else:
            self.up = False
            self.errors[result.reason or "read"] += 1
            self.last_error = result.error
            self.history.prune(timestamp)


@dataclass(frozen=True)
class TargetView:
    topology: str
    instance: str
    role: str
    url: str
    gpus: int
    up: bool
    scrapes: int
    scrape_duration_seconds: float | None
    last_success_timestamp: float | None
    body_bytes: int
    errors: dict[str, int]  # every reason of ERROR_REASONS, zeros included
    last_error: str | None


@dataclass(frozen=True)
class GroupView:
    """Derived figures of one group (a topology, one role of a P/D topology, or an instance)."""

    topology: str
    role: str | None
    instance: str | None
    gpus: int
    windows: dict[str, Derived]  # window name ("1m") -> figures
    # A topology's figures for one value of one of its entrypoint's split_by labels: (label, value).
    split: tuple[str, str] | None = None


@dataclass(frozen=True)
class Snapshot:
    timestamp: float
    interval_seconds: float
    windows: dict[str, float]  # window name -> seconds
    slos_seconds: dict[str, float]
    targets: tuple[TargetView, ...] = ()
    topologies: tuple[GroupView, ...] = ()
    roles: tuple[GroupView, ...] = ()
    instances: tuple[GroupView, ...] = ()
    cycle_seconds: float = 0.0
    spec_reloads: dict[str, int] = field(default_factory=dict)
    # Topologies whose entrypoint targets answer but expose no request family (decode-side instead).
    silent_entrypoints: tuple[str, ...] = ()
    # Topologies' figures per value of each entrypoint split_by label (GroupView.split), beside the
    # unsplit ones in `topologies`; empty where no topology asks for a split.
    splits: tuple[GroupView, ...] = ()


def window_names(spec: FleetSpec) -> dict[str, float]:
    return {format_duration(seconds): seconds for seconds in spec.scrape.window_seconds}


def slos_seconds(spec: FleetSpec) -> dict[str, float]:
    return {name: ms / 1000.0 for name, ms in spec.slos.thresholds_ms.items()}


_Ticket = tuple[int, int]  # (what was asked for, its row)
# A view to build: topology, role, instance, GPUs, and its ticket per window.
_Wanted = tuple[str, str | None, str | None, int, dict[str, _Ticket]]


class _WindowDerivation:
    """Every group's figures over one window. Targets whose windows share one keys tuple (a
    homogeneous fleet) are reduced together, one row each (window_rows); groups are merged from
    those rows, once however many views read them; and every figure asked for (`want`) is derived
    at once (`derive`), one call per shape of WindowSums (derive_many)."""

    def __init__(self, health: Sequence[TargetHealth], now: float, seconds: float,
                 slos: Mapping[str, float]) -> None:
        self.seconds = seconds
        self.slos = slos
        self._wanted: list[tuple[WindowSums, list[int]]] = []
        self._derived: list[list[Derived]] = []
        self._group_sums: dict[tuple[tuple[str, str], ...], WindowSums] = {}
        self._rows: dict[tuple[str, str], tuple[WindowSums, int]] = {}
        self._instances: dict[tuple[str, str], _Ticket] = {}
        self._windows: dict[tuple[str, str], SeriesWindow] = {}
        together: dict[int, list[tuple[Target, SeriesWindow]]] = {}
        for record in health:
            window = record.history.window(now, seconds)
            if window is not None:  # a window whose series came or went reduces alone
                self._windows[record.target.key] = window
                key = id(window.keys) if window.complete else id(window)
                together.setdefault(key, []).append((record.target, window))
        for members in together.values():
            sums = window_rows([window for _, window in members])
            wanted = len(self._wanted)
            self._wanted.append((sums, [target.gpus for target, _ in members]))
            for row, (target, _) in enumerate(members):
                self._rows[target.key] = (sums, row)
                self._instances[target.key] = (wanted, row)

    def want(self, sums: WindowSums, gpus: int) -> _Ticket:
        """Ask for one group's figures (read them with `figures` after `derive`)."""
        self._wanted.append((sums, [gpus]))
        return len(self._wanted) - 1, 0

    def instance(self, target: Target) -> _Ticket:
        found = self._instances.get(target.key)
        return found if found is not None else self.want(WindowSums(), target.gpus)

    def sums(self, members: Sequence[Target]) -> WindowSums:
        """The members' window, merged once however many groups read it (a P/D topology's figures
        read its roles' sums, which its role rows show too)."""
        key = tuple(t.key for t in members)
        sums = self._group_sums.get(key)
        if sums is None:
            # The members' rows in member order, a run of rows of one WindowSums picked at once.
            picks: list[tuple[WindowSums, list[int]]] = []
            for target in members:
                placed = self._rows.get(target.key)
                if placed is None:
                    continue
                if picks and picks[-1][0] is placed[0]:
                    picks[-1][1].append(placed[1])
                else:
                    picks.append((placed[0], [placed[1]]))
            sums = self._group_sums[key] = merge_rows(picks)
        return sums

    def split_values(self, members: Sequence[Target], label: str) -> list[str]:
        """The values `label` takes on the members' series in this window."""
        found = {value for t in members if (w := self._windows.get(t.key)) is not None
                 for value in label_values(w, label)}
        return sorted(found)

    def split_sums(self, members: Sequence[Target], label: str, value: str) -> WindowSums:
        """The members' window restricted to the series whose `label` is `value`."""
        picks: list[tuple[WindowSums, Sequence[int] | None]] = [
            (window_rows([only(w, label, value)]), None)
            for t in members if (w := self._windows.get(t.key)) is not None]
        return merge_rows(picks)

    def derive(self) -> None:
        self._derived = derive_many(self._wanted, slos_seconds=self.slos, window_seconds=self.seconds)

    def figures(self, ticket: _Ticket) -> Derived:
        return self._derived[ticket[0]][ticket[1]]


def topology_sums(members: Sequence[Target], sums_of: Callable[[Sequence[Target]], WindowSums]
                  ) -> tuple[WindowSums, str, bool]:
    """A topology as its users see it (derive.user_facing) from `sums_of` its members' groups: its
    sums, where its request figures come from (crossover.spec.REQUEST_SOURCES), and True when an
    entrypoint target has a window but none of the request families (the decode side is used
    instead)."""
    by_role: dict[str, list[Target]] = {}
    for target in members:
        by_role.setdefault(target.role, []).append(target)
    entry = sums_of(by_role.get(ENTRYPOINT_ROLE, []))
    instances = sums_of([t for t in members if t.role != ENTRYPOINT_ROLE])
    counted = exposes_requests(entry)
    silent = bool(entry.targets.any()) and not counted
    source = requests_source(entrypoint_counts=counted, has_decode=Role.DECODE.value in by_role)
    sums = instances
    if source != "instances" or ENTRYPOINT_ROLE in by_role:
        decode = sums_of(by_role[Role.DECODE.value]) if Role.DECODE.value in by_role else instances
        prefill = sums_of(by_role[Role.PREFILL.value]) if Role.PREFILL.value in by_role else instances
        sources = {"entrypoint": [entry, decode], "decode": [decode], "instances": [instances]}[source]
        sums = user_facing(instances, sources, decode, prefill)
    return sums, source, silent


def topology_figures(members: Sequence[Target], sums_of: Callable[[Sequence[Target]], WindowSums], *,
                     gpus: int, slos_seconds: Mapping[str, float],
                     window_seconds: float) -> tuple[Derived, bool]:
    """The figures of topology_sums, and whether the entrypoint fell back (see there)."""
    sums, source, silent = topology_sums(members, sums_of)
    derived = derive_sums(sums, gpus=gpus, slos_seconds=slos_seconds, window_seconds=window_seconds)
    return dataclasses.replace(derived, requests_source=source), silent


def build_snapshot(spec: FleetSpec, health: Sequence[TargetHealth], now: float, *,
                   cycle_seconds: float = 0.0, spec_reloads: Mapping[str, int] | None = None) -> Snapshot:
    """Derive every group over every window from the targets' histories, as of `now`: every view's
    figures are asked for first, then derived at once per window."""
    windows = window_names(spec)
    slos = slos_seconds(spec)
    derivations = {name: _WindowDerivation(health, now, seconds, slos) for name, seconds in windows.items()}

    def group(members: Sequence[Target], topology: str, role: str | None) -> _Wanted:
        gpus = sum(t.gpus for t in members)
        return topology, role, None, gpus, {name: d.want(d.sums(members), gpus)
                                            for name, d in derivations.items()}

    targets = [record.target for record in health]
    topologies: list[tuple[_Wanted, dict[str, str]]] = []
    roles: list[_Wanted] = []
    instances: list[_Wanted] = []
    silent: list[str] = []
    splits: list[tuple[_Wanted, tuple[str, str]]] = []
    for topology in spec.topologies:
        members = [t for t in targets if t.topology == topology.name]
        if not members:
            continue
        gpus = sum(t.gpus for t in members)
        tickets: dict[str, _Ticket] = {}
        sources: dict[str, str] = {}
        for name, derivation in derivations.items():
            sums, sources[name], fell_back = topology_sums(members, derivation.sums)
            tickets[name] = derivation.want(sums, gpus)
            if fell_back and topology.name not in silent:
                silent.append(topology.name)
        topologies.append(((topology.name, None, None, gpus, tickets), sources))
        by_role: dict[str, list[Target]] = {}
        for target in members:
            by_role.setdefault(target.role, []).append(target)
        entry = by_role.get(ENTRYPOINT_ROLE, [])
        for label in dict.fromkeys(label for t in entry for label in t.split_by):
            values = sorted({v for d in derivations.values() for v in d.split_values(entry, label)})
            for value in values:
                tickets = {}
                for name, derivation in derivations.items():
                    # Request families from the split alone: a family the router does not serve
                    # stays absent rather than the decode side's, which knows no router label.
                    engines = derivation.sums([t for t in members if t.role != ENTRYPOINT_ROLE])
                    decode, prefill = (derivation.sums(by_role[r]) if r in by_role else engines
                                       for r in (Role.DECODE.value, Role.PREFILL.value))
                    sums = user_facing(engines, [derivation.split_sums(entry, label, value)], decode, prefill)
                    tickets[name] = derivation.want(sums, gpus)
                splits.append(((topology.name, None, None, gpus, tickets), (label, value)))
        present_roles = sorted({t.role for t in members})
        if present_roles != ["colocated"]:
            for role in present_roles:
                roles.append(group([t for t in members if t.role == role], topology.name, role))
        for target in members:
            instances.append((topology.name, target.role, target.instance, target.gpus,
                              {name: d.instance(target) for name, d in derivations.items()}))
    for derivation in derivations.values():
        derivation.derive()

    def view(wanted: _Wanted, sources: Mapping[str, str] | None = None) -> GroupView:
        topology, role, instance, gpus, tickets = wanted
        figures = {name: derivations[name].figures(ticket) for name, ticket in tickets.items()}
        if sources is not None:
            figures = {name: dataclasses.replace(figures[name], requests_source=source)
                       for name, source in sources.items()}
        return GroupView(topology, role, instance, gpus, figures)

    views = tuple(
        TargetView(r.target.topology, r.target.instance, r.target.role, r.target.metrics_url, r.target.gpus,
                   r.up, r.scrapes, r.last_duration, r.last_success, r.body_bytes,
                   {reason: r.errors.get(reason, 0) for reason in ERROR_REASONS}, r.last_error)
        for r in health)
    return Snapshot(now, spec.scrape.interval_seconds, windows, slos, views,
                    tuple(view(wanted, sources) for wanted, sources in topologies),
                    tuple(view(wanted) for wanted in roles), tuple(view(wanted) for wanted in instances),
                    cycle_seconds, dict(spec_reloads or {}), tuple(silent),
                    tuple(dataclasses.replace(view(wanted), split=split) for wanted, split in splits))


# --- JSON --------------------------------------------------------------------------------------------
def _clean(value: Any) -> Any:
    """NaN and infinities become null (JSON has neither)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def derived_json(derived: Derived) -> dict[str, Any]:
    out = asdict(derived)
    out["joint_slos"] = list(derived.joint_slos)
    for name in ("prompt_tokens_per_second_per_gpu", "generation_tokens_per_second_per_gpu",
                 "requests_per_second_per_gpu", "goodput_tokens_per_second_per_gpu_lower",
                 "goodput_tokens_per_second_per_gpu_upper"):
        out[name] = getattr(derived, name)
    return out


def _group_json(view: GroupView) -> dict[str, Any]:
    return {"topology": view.topology, "role": view.role, "instance": view.instance, "gpus": view.gpus,
            "windows": {name: derived_json(d) for name, d in view.windows.items()}}


def _headline(view: GroupView, window: str) -> dict[str, Any]:
    """A few flat figures of the shortest window, for quick readers (the app's live chart)."""
    derived = view.windows[window]
    tail = quantile_label(TAIL_QUANTILE)

    def ms(kind: str) -> float | None:
        latency = derived.latency.get(kind)
        return None if latency is None else latency.quantiles[tail] * 1000.0

    return {"requests_source": derived.requests_source,
            f"{GOODPUT_REQUESTS}_lower": derived.goodput_requests_per_second_lower,
            f"{GOODPUT_TOKENS}_lower": derived.goodput_tokens_per_second_lower,
            f"{GOODPUT_TOKENS}_upper": derived.goodput_tokens_per_second_upper,
            "output_tps": derived.generation_tokens_per_second,
            **{percentile_column(kind, TAIL_QUANTILE): ms(kind) for kind in TAIL_KINDS}}


def snapshot_json(snapshot: Snapshot) -> dict[str, Any]:
    """The /api/v1/snapshot document (schema in docs/exporter.md). Holds no credentials: targets
    are described by their labels and URL only."""
    shortest = min(snapshot.windows, key=lambda n: snapshot.windows[n]) if snapshot.windows else None
    topologies = []
    for view in snapshot.topologies:
        entry = {"name": view.topology, **_group_json(view)}
        if shortest is not None:
            entry.update(_headline(view, shortest))
        entry["roles"] = [_group_json(r) for r in snapshot.roles if r.topology == view.topology]
        entry["instances"] = [_group_json(i) for i in snapshot.instances if i.topology == view.topology]
        topologies.append(entry)
    return _clean({
        "timestamp": snapshot.timestamp,
        "interval_seconds": snapshot.interval_seconds,
        "windows": snapshot.windows,
        "headline_window": shortest,
        "slos_seconds": snapshot.slos_seconds,
        "cycle_seconds": snapshot.cycle_seconds,
        "targets": [asdict(t) for t in snapshot.targets],
        "topologies": topologies,
    })


def empty_snapshot(spec: FleetSpec, targets: Iterable[Target], now: float) -> Snapshot:
    """Before the first cycle: every target known, nothing derived yet."""
    health = [TargetHealth(t, History(1.0)) for t in targets]
    return build_snapshot(spec, health, now)
