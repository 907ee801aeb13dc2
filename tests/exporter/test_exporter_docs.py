"""docs/exporter.md documents every exported series: its table is generated from the names module."""

from __future__ import annotations

from crossover.exporter import docs, names
from tests.helpers import REPO


def test_committed_series_table_is_up_to_date():
    text = (REPO / docs.DOC).read_text(encoding="utf-8")
    assert docs.BEGIN in text and docs.END in text
    assert docs.render(text) == text, "run: python -m crossover.exporter.docs"


def test_every_exported_series_is_documented():
    text = (REPO / docs.DOC).read_text(encoding="utf-8")
    for metric in (*names.TARGET_METRICS, *names.EXPORTER_METRICS):
        assert f"`{metric.name}`" in text
    for series in names.DERIVED_SERIES:
        assert f"`{series.suffix}`" in text
    assert len(names.EXPORTED_NAMES) == len(names.EXPORTED_METRICS)
