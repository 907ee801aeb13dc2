"""Which histogram bucket each SLO reads, and the `le` matcher that finds that bucket whatever
spelling of its boundary a target or Prometheus uses.

Whether a threshold is a bucket boundary, and the sentence that says it is not, are crossover.slo's
(`boundary_index`, `not_a_boundary`): the spec's warning and the exporter decide it the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from crossover import slo
from crossover.catalog import DIALECTS, VLLM_DIALECT, Metric
from crossover.errors import UserError
from crossover.rules.raw_series import promql_string
from crossover.spec import FleetSpec


@dataclass(frozen=True)
class SloBucket:
    """Which histogram bucket an SLO reads, and whether that is the SLO exactly."""

    slo: str
    threshold_ms: float
    metric: Metric
    le: float  # the bucket boundary in seconds
    exact: bool

    @property
    def le_regex(self) -> str:
        return le_regex(self.le)

    @property
    def le_matcher(self) -> str:
        """`le=~"..."` with the regex escaped for a PromQL string literal."""
        return "le=~" + promql_string(self.le_regex)


def slo_buckets(spec: FleetSpec, refuse_off_boundary: bool = False,
                source: str = "spec") -> tuple[tuple[SloBucket, ...], tuple[str, ...]]:
    """Pick each SLO's bucket: the boundary itself, or the stricter neighbour below it (with a
    warning), never a looser one; refuse when asked to, or when no boundary lies below."""
    chosen: list[SloBucket] = []
    warnings: list[str] = []
    for kind, threshold_ms in spec.slos.thresholds_ms.items():
        metric = slo.SLO_HISTOGRAMS[kind]
        threshold_s = threshold_ms / 1000.0
        boundary = slo.boundary_index(threshold_s, metric.buckets)
        if boundary is not None:
            chosen.append(SloBucket(kind, threshold_ms, metric, metric.buckets[boundary], exact=True))
            continue
        below, _above = slo.bucket_neighbours(threshold_s, metric.buckets)
        where = f"{source}: slos.{kind}_ms: {slo.not_a_boundary(threshold_ms, metric.name, metric.buckets)}"
        if refuse_off_boundary:
            raise UserError(f"{where}; pick a boundary or drop --refuse-off-boundary to round down")
        if below is None:
            raise UserError(f"{where}; no stricter boundary exists below it, pick one of the buckets")
        chosen.append(SloBucket(kind, threshold_ms, metric, below, exact=False))
        warnings.append(f"{where}; the rules count a request as good only below {below * 1000:g} ms "
                        "(the stricter neighbour), so goodput is a lower bound")
    warnings.extend(_dialect_warnings(spec, chosen, source))
    return tuple(chosen), tuple(warnings)


def _dialect_warnings(spec: FleetSpec, chosen: Iterable[SloBucket], source: str) -> list[str]:
    """One line per SLO bucket a router dialect's own buckets lack (the rules read one `le` per SLO,
    vLLM's): that topology's attainment of the SLO is then missing in the rules (the exporter, which
    reads the bounds a target exposes, still has it)."""
    out: list[str] = []
    for topology in spec.topologies:
        dialect = DIALECTS.get(topology.entrypoint.dialect or "")
        if dialect is None or dialect is VLLM_DIALECT:
            continue
        for bucket in chosen:
            family = dialect.histogram_for(bucket.metric)
            if family is None or slo.boundary_index(bucket.le, family.buckets) is not None:
                continue
            out.append(f"{source}: slos.{bucket.slo}_ms: the rules read the bucket at "
                       f"{bucket.le * 1000:g} ms, which {family.name} (topology {topology.name}'s "
                       f"entrypoint, dialect {dialect.name}) "
                       "lacks: that topology's attainment of it is missing in the rules; pick a threshold on "
                       "both bucket sets")
    return out


def request_slo_buckets(buckets: Iterable[SloBucket]) -> list[SloBucket]:
    """The buckets of the SLOs that enter the joint bounds (crossover.slo.PER_REQUEST_SLOS)."""
    return [b for b in buckets if b.slo in slo.PER_REQUEST_SLOS]


# ---- le matching -----------------------------------------------------------------------------

def le_spellings(value: float) -> tuple[str, ...]:
    """Text forms an exposition may give a bucket boundary: prometheus_client writes repr ("1.0"),
    Go clients and Prometheus 3's normalisation write Go's shortest 'g' form ("1", "1e+06"), others
    the plain positional form. Every form listed parses back to exactly `value`."""
    positional = np.format_float_positional(value, unique=True, trim="-")
    scientific = np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)
    forms = {repr(value), positional, scientific}
    if "." not in positional:
        forms.add(positional + ".0")
    return tuple(sorted(f for f in forms if _same_float(f, value)))


def _same_float(text: str, value: float) -> bool:
    try:
        return float(text) == value
    except ValueError:
        return False


def le_regex(value: float) -> str:
    """A regex matching the bucket whatever spelling of its boundary the target or Prometheus uses."""
    return "|".join(re.escape(form) for form in le_spellings(value))
