"""The vLLM metric catalog is the only place that spells a vLLM metric name."""

from __future__ import annotations

import re

from crossover.catalog import CATALOG, KV_CACHE_USAGE, TTFT, MetricType, token_count_buckets
from tests.helpers import REPO

# A vLLM metric name in source: `vllm:` followed by a snake_case identifier.
VLLM_NAME = re.compile(r"vllm:[a-z][a-z0-9_]+")
SOURCE_DIRS = ("crossover", "exporter", "rules", "dashboards", "app", "sim", "loadgen", "benchmarks",
               "scripts", "tests", "devkit")


def test_no_module_but_the_catalog_spells_a_vllm_metric_name() -> None:
    offenders = []
    # Scripts have no .py suffix (scripts/capture-vllm-fixtures is Python), so all of them count.
    sources = [p for folder in SOURCE_DIRS for p in sorted((REPO / folder).rglob("*.py"))]
    sources += [p for p in sorted((REPO / "scripts").iterdir()) if p.is_file() and p.suffix != ".py"]
    assert any(p.name == "capture-vllm-fixtures" for p in sources)
    for path in sources:
        if path == REPO / "crossover" / "catalog.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if VLLM_NAME.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "vLLM metric names outside crossover/catalog.py:\n" + "\n".join(offenders)


def test_the_scan_would_catch_a_name() -> None:
    assert VLLM_NAME.search("rate(vllm" + ":generation_tokens_total[1m])")


def test_aliases_resolve_to_current_metric() -> None:
    assert CATALOG.lookup(KV_CACHE_USAGE.aliases[0]) is KV_CACHE_USAGE
    metric, suffix = CATALOG.family_of_sample(TTFT.name + "_bucket") or (None, "")
    assert metric is TTFT and suffix == "_bucket"


def test_counter_and_histogram_sample_names() -> None:
    counters = [m for m in CATALOG.metrics if m.type is MetricType.COUNTER]
    assert all(m.sample_names == (m.name + "_total",) for m in counters)
    assert TTFT.sample_names[0].endswith("_bucket")


def test_buckets_are_sorted_and_unique() -> None:
    for metric in CATALOG.metrics:
        assert list(metric.buckets) == sorted(set(metric.buckets)), metric.name


def test_token_count_buckets_follow_1_2_5() -> None:
    assert token_count_buckets(2048) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000)
