"""The servers' own view of a level, kept with the run: each instance's /metrics scraped just before
and just after the level, and the exporter's figures derived over that window (the same parser,
window and derivation as `crossover exporter`), written beside the level's requests as
LEVEL.server.json. A finished run then shows client and server side by side without Prometheus.

A target that cannot be scraped (no /metrics, down, refusing the token) is named in the file's
`scrape_errors`; it never fails the level.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import pandas as pd

from crossover import slo
from crossover.errors import UserError
from crossover.exporter.collector import derived_rows
from crossover.exporter.derive import WindowSums, merge, window_sums
from crossover.exporter.parse import ParsedSeries, Parser
from crossover.exporter.scrape import scrape
from crossover.exporter.state import slos_seconds, topology_figures
from crossover.exporter.window import Scrape, window_of
from crossover.spec import FleetSpec, Target, spec_targets

T = TypeVar("T")


def _name(suffix: str, labels: Sequence[str]) -> str:
    """A derived_rows row's name in LEVEL.server.json: `suffix{label,...}`."""
    return f"{suffix}{{{','.join(labels)}}}" if labels else suffix


# The figures the app and `load_run` show per level, from derived_rows' names: each SLO kind's tail
# latency (in ms), then the fleet's rates and gauges.
SERVER_COLUMNS = {**{_name(f"{kind}_seconds", (slo.quantile_label(slo.TAIL_QUANTILE),)):
                     f"server_{slo.percentile_column(kind, slo.TAIL_QUANTILE)}" for kind in slo.SLO_KINDS},
                  "generation_tokens_per_second": "server_output_tps",
                  "prompt_tokens_per_second": "server_prompt_tps",
                  "requests_per_second": "server_request_rate",
                  "kv_cache_usage_max_ratio": "server_kv_cache_max",
                  "preemptions_per_second": "server_preemptions", "requests_waiting": "server_waiting"}


@dataclass
class Scrapes:
    """One scrape of every target of a topology: instance -> its parsed series, and the failures."""

    taken: float
    series: dict[str, ParsedSeries]
    errors: dict[str, str]


class ServerView:
    """Scrapes a topology's instances around a level and derives the level's server figures."""

    def __init__(self, spec: FleetSpec, topology: str) -> None:
        self.spec = spec
        self.targets: list[Target] = [t for t in spec_targets(spec) if t.topology == topology]
        self.gpus = spec.topology(topology).gpus
        self.parser = Parser()
        try:
            self.token = spec.scrape.bearer_token()
        except UserError:
            self.token = None  # the exporter scrapes without it too, and says so there

    async def scrape_all(self) -> Scrapes:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
            results = await asyncio.gather(*(scrape(
                session, target, self.parser, timeout=self.spec.scrape.timeout_seconds,
                max_body_bytes=self.spec.scrape.max_body_bytes, max_series=self.spec.scrape.max_series,
                bearer_token=self.token) for target in self.targets))
        taken = time.time()
        series, errors = {}, {}
        for result in results:
            if result.series is not None:
                series[result.target.instance] = result.series
            else:
                errors[result.target.instance] = f"{result.reason}: {result.error}"
        return Scrapes(taken, series, errors)

    async def around(self, level: Awaitable[T]) -> tuple[T, dict[str, Any]]:
        """What `level` returns, and the figures over the time it ran (scraped before and after)."""
        before = await self.scrape_all()
        result = await level
        return result, self.level_figures(before, await self.scrape_all())

    def level_figures(self, before: Scrapes, after: Scrapes) -> dict[str, Any]:
        """The exporter's figures for the topology over [before, after]."""
        seconds = after.taken - before.taken
        sums: dict[str, WindowSums] = {}
        for instance, series in before.series.items():
            if instance in after.series:
                first = Scrape.of(before.taken, series)
                last = Scrape.of(after.taken, after.series[instance], first)  # counter resets undone
                window = window_of([first, last], end=after.taken, seconds=seconds)
                if window is not None:
                    sums[instance] = window_sums(window)

        def sums_of(members: Sequence[Target]) -> WindowSums:
            found = [sums[t.instance] for t in members if t.instance in sums]
            return merge(found) if found else WindowSums()

        # the topology as its users see it: each request once, from its entrypoint where it has one
        derived, _ = topology_figures(self.targets, sums_of, gpus=self.gpus,
                                      slos_seconds=slos_seconds(self.spec), window_seconds=seconds)
        figures = {_name(suffix, labels): value for suffix, labels, value in derived_rows(derived)}
        return {"window_s": seconds, "start": before.taken, "end": after.taken, "figures": figures,
                "scrape_errors": {**before.errors, **after.errors}}


def server_frame(views: Sequence[tuple[str, float, dict[str, Any]]]) -> pd.DataFrame:
    """(topology, level, LEVEL.server.json) -> one row per level of the figures worth a column."""
    rows = []
    for topology, level, view in views:
        figures = view.get("figures", {})
        row: dict[str, Any] = {"topology": topology, "level": level}
        for name, column in SERVER_COLUMNS.items():
            value = figures.get(name)
            row[column] = value * 1000 if value is not None and column.endswith("_ms") else value
        rows.append(row)
    return pd.DataFrame(rows)
