"""Reading a scrape target in its dialect (crossover.catalog.DIALECTS, docs/routers.md).

An entrypoint target's series are turned into vLLM's entrypoint families (catalog.ENTRYPOINT_FAMILIES,
with the request outcomes as slo.outcomes reads them), so that derivation, the SLO module and every
output read one shape whatever router stands in front of a topology:

- each request histogram of the dialect becomes vLLM's (TTFT, ITL, TPOT, e2e), on the dialect's own
  bucket bounds (the exporter reads the bounds a target exposes), summed over the router's extra
  labels (priority, fairness_id, target_model_name, streaming) so that series are never multiplied,
  except those the spec's entrypoint.split_by keeps (the topology's split figures, crossover.exporter.state);
- its request counter becomes REQUEST_SUCCESS{finished_reason=slo.ROUTED_REASON}; its errors become
  finished_reason "error" (failed after the counter counted them), an admission rejection (refused
  before) or nothing (the client's own mistake, as crossover.slo counts it).

Only sums of the router's own counters are formed, never differences: a translated counter grows
exactly when its sources do, so counter-reset detection downstream stays right.

An instance target (an engine) that serves a router-only dialect (production-stack's vLLM-named
gauges with a `server` label) is refused: its figures would be summed with the engines'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from crossover import catalog, slo
from crossover.catalog import Dialect
from crossover.exporter.parse import ParsedSeries, SeriesKey
from crossover.spec import ENTRYPOINT_ROLE, Target


def _markers(dialect: Dialect) -> frozenset[str]:
    return frozenset(name for m in dialect.markers for name in m.sample_names)


_MARKERS: tuple[tuple[Dialect, frozenset[str]], ...] = tuple(
    (d, _markers(d)) for d in catalog.DIALECTS.values())
_ROUTER_ONLY: tuple[tuple[Dialect, frozenset[str]], ...] = tuple(
    (d, _markers(d)) for d in catalog.ROUTER_ONLY_DIALECTS)


def detect(names: Iterable[str]) -> Dialect | None:
    """The dialect of a target from the sample names it serves (catalog.DIALECTS order), or None."""
    present = set(names)
    return next((d for d, markers in _MARKERS if present & markers), None)


_TYPE_RE = re.compile(r"^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*)", re.MULTILINE)


def served_families(text: str, limit: int = 6) -> str:
    """What a payload serves, in one short phrase for a log line: its first family names and a count."""
    names = list(dict.fromkeys(_TYPE_RE.findall(text)))
    if not names:
        return "no metric families"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"{len(names)} families: {', '.join(names[:limit])}{more}"


# Per dialect: exposed sample name -> how it maps (kind, vLLM sample name or None, the family's label filter)
_Plan = dict[str, tuple[str, str, tuple[str, str] | None]]
_PLANS: dict[str, _Plan] = {}


def _plan(dialect: Dialect) -> _Plan:
    plan = _PLANS.get(dialect.name)
    if plan is not None:
        return plan
    only = dict(dialect.only)
    plan = {}
    for vllm, mine in dialect.histograms:
        for suffix in ("_bucket", "_sum", "_count"):
            plan[mine.name + suffix] = ("histogram", vllm.name + suffix, only.get(mine.name))
    if dialect.requests is not None:
        plan[dialect.requests.sample_names[0]] = ("requests", "", None)
    if dialect.errors is not None:
        plan[dialect.errors.sample_names[0]] = ("errors", "", None)
    _PLANS[dialect.name] = plan
    return plan


_SUCCESS = catalog.REQUEST_SUCCESS.sample_names[0]
_REJECTIONS = catalog.ADMISSION_REJECTIONS.sample_names[0]


def translate(series: ParsedSeries, dialect: Dialect, keep: tuple[str, ...] = ()) -> ParsedSeries:
    """A target's series in `dialect` as vLLM's entrypoint families (see the module's docstring),
    keeping the labels in `keep` (the spec's entrypoint.split_by: derivation sums them away for the
    topology's figures and splits by them for its split ones)."""
    if dialect is catalog.VLLM_DIALECT:
        return series
    plan = _plan(dialect)
    out: dict[SeriesKey, float] = {}
    for (name, labels), value in zip(series.keys, series.values, strict=True):
        step = plan.get(name)
        if step is None:
            continue
        kind, target, only = step
        found = dict(labels)
        if only is not None and found.get(only[0]) != only[1]:
            continue
        kept: dict[str, str] = {"model_name": found.get(dialect.model_label, "")}
        for label in keep:
            if label in found:
                kept[label] = found[label]
        if kind == "histogram":
            if "le" in found:
                kept["le"] = found["le"]
        elif kind == "requests":
            target = _SUCCESS
            kept["finished_reason"] = slo.ROUTED_REASON
        else:
            code = found.get(dialect.error_label, "")
            if code in dialect.client_errors:
                continue  # the client's own mistake: counted nowhere (crossover.slo)
            if dialect.errors_in_requests is None or code in dialect.errors_in_requests:
                target = _SUCCESS
                kept["finished_reason"] = "error"
            else:
                target = _REJECTIONS
                kept["reason"] = code
        key: SeriesKey = (target, tuple(sorted(kept.items())))
        out[key] = out.get(key, 0.0) + value
    return ParsedSeries(tuple(out), list(out.values()))


def read(target: Target, series: ParsedSeries) -> tuple[ParsedSeries, str | None]:
    """What the exporter keeps of one target's scrape: (series, None), or (series, a one-line reason to
    refuse the target). An entrypoint is read in its spec's dialect or the one detected; one serving
    no known dialect keeps its series as they are (none of the entrypoint families: the topology
    falls back to its decode side)."""
    names = {key[0] for key in series.keys}
    if target.role != ENTRYPOINT_ROLE:
        router = next((d for d, markers in _ROUTER_ONLY if names & markers), None)
        if router is None:
            return series, None
        return series, (f"{target.metrics_url} serves {router.name} router series, not an engine's; summed "
                        "with the engines' they would count every request twice: give it as the "
                        "topology's entrypoint (entrypoint.metrics_url) instead")
    dialect = catalog.DIALECTS[target.dialect] if target.dialect is not None else detect(names)
    if dialect is None:
        return series, None
    return translate(series, dialect, target.split_by), None
