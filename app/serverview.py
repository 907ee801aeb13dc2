"""The server-side view: what the fleet's own metrics said while the sweep ran.

A `ServerPoller` thread asks the exporter (`/api/v1/snapshot`) or Prometheus (the recording rules
of crossover.rules) for per-topology goodput and p99s every scrape interval and keeps the history
as rows; the page charts them over time with the sweep's levels marked. The poller only reads:
it never sends traffic to the fleet's targets.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from crossover import slo
from crossover.app.config import AppConfig
from crossover.app.runner import LevelMark
from crossover.spec import FleetSpec, format_duration

MAX_ROWS = 20_000
FETCH_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Series:
    key: str
    title: str
    unit: str


SERIES: tuple[Series, ...] = (
    Series("goodput_tps", "Server-side token goodput, lower bound", "tok/s"),
    Series("output_tps", "Server-side output tokens/s", "tok/s"),
    *(Series(slo.percentile_column(kind, slo.TAIL_QUANTILE),
             f"Server-side {kind.upper()} {slo.percentile_label(slo.TAIL_QUANTILE)}", "ms")
      for kind in slo.TAIL_KINDS),
)


@dataclass(frozen=True)
class ServerHistory:
    frame: pd.DataFrame  # time (datetime), topology, one column per Series key present
    error: str | None  # the last fetch's problem, one line; None when it worked
    key: int = 0  # grows with every poll that brought rows: the charts' cache key


# Where each topology's request figures come from (crossover.spec.REQUEST_SOURCES), per row.
SOURCE = "requests_source"


def decode_side(frame: pd.DataFrame) -> list[str]:
    """Topologies whose latest request figures are decode-side (a P/D topology without entrypoint
    metrics: its TTFT excludes the prefill)."""
    if SOURCE not in frame.columns or frame.empty:
        return []
    latest = frame.dropna(subset=[SOURCE]).groupby("topology")[SOURCE].last()
    return sorted(str(t) for t, source in latest.items() if source == "decode")


def configured_source(config: AppConfig) -> tuple[str, str] | None:
    """("exporter", url) or ("prometheus", url); the exporter wins when both are given."""
    if config.exporter_url:
        return "exporter", config.exporter_url
    if config.prometheus_url:
        return "prometheus", config.prometheus_url
    return None


def get_json(url: str, timeout_s: float = FETCH_TIMEOUT_S) -> Any:
    """GET a JSON document; any failure is a ValueError with one readable line."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return json.loads(response.read(16 * 1024 * 1024))
    except urllib.error.HTTPError as exc:
        raise ValueError(f"{url}: HTTP {exc.code} {exc.reason}") from None
    except urllib.error.URLError as exc:
        raise ValueError(f"{url}: cannot connect ({exc.reason})") from None
    except (TimeoutError, OSError) as exc:
        raise ValueError(f"{url}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{url}: not JSON ({exc.msg})") from None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


# ---- the exporter ---------------------------------------------------------------------------------

def exporter_rows(snapshot: Any, now: float) -> list[dict[str, Any]]:
    """Rows (time, topology, series...) from one /api/v1/snapshot document."""
    topologies = snapshot.get("topologies") if isinstance(snapshot, dict) else None
    if isinstance(topologies, dict):
        items = [{"name": name, **body} for name, body in topologies.items() if isinstance(body, dict)]
    elif isinstance(topologies, list):
        items = [item for item in topologies if isinstance(item, dict)]
    else:
        raise ValueError("exporter snapshot has no 'topologies'")
    rows = []
    for item in items:
        row: dict[str, Any] = {"time": now, "topology": str(item.get("name", item.get("topology", "?")))}
        for series in SERIES:
            value = _number(item.get(series.key))
            if value is not None:
                row[series.key] = value
        if isinstance(item.get(SOURCE), str):
            row[SOURCE] = item[SOURCE]
        rows.append(row)
    return rows


# ---- Prometheus -------------------------------------------------------------------------------------

def prometheus_queries(spec: FleetSpec) -> dict[str, str]:
    """Series key -> the recording rule that holds it (names from crossover.rules, never spelled here)."""
    from crossover import catalog
    from crossover.rules.names import (
        goodput_tokens_name,
        quantile_name,
        rate_name,
        requests_source_name,
    )

    window = format_duration(min(spec.scrape.window_seconds))
    return {
        "goodput_tps": goodput_tokens_name(window),
        "output_tps": rate_name(catalog.GENERATION_TOKENS, window),
        **{slo.percentile_column(kind, slo.TAIL_QUANTILE):
           f"1000 * {quantile_name(slo.SLO_HISTOGRAMS[kind], slo.TAIL_QUANTILE, window)}"
           for kind in slo.TAIL_KINDS},
        SOURCE: requests_source_name(),
    }


def prometheus_rows(url: str, queries: dict[str, str], now: float,
                    fetch: Callable[[str], Any] = get_json) -> list[dict[str, Any]]:
    """One instant query per series, merged into rows per topology."""
    by_topology: dict[str, dict[str, Any]] = {}
    for key, query in queries.items():
        answer = fetch(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": query}))
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error", "unknown error") if isinstance(answer, dict) else "bad answer"
            raise ValueError(f"Prometheus query {query!r} failed: {error}")
        for sample in answer.get("data", {}).get("result", []):
            topology = sample.get("metric", {}).get("topology")
            value: Any = _number((sample.get("value") or [None, None])[1])
            if key == SOURCE:  # the source is the series' label, its value is 1
                value = sample.get("metric", {}).get("source")
            if topology is None or value is None:
                continue
            row = by_topology.setdefault(topology, {"time": now, "topology": topology})
            row[key] = value
    return list(by_topology.values())


# ---- the poller ------------------------------------------------------------------------------------

class ServerPoller:
    """Polls one source every scrape interval in a daemon thread and keeps the rows."""

    def __init__(self, source: str, url: str, spec: FleetSpec, interval_s: float | None = None) -> None:
        self.source = source
        self.url = url
        self.interval_s = interval_s if interval_s is not None else spec.scrape.interval_seconds
        self._queries = prometheus_queries(spec) if source == "prometheus" else {}
        self._lock = threading.Lock()
        self._rows: list[dict[str, Any]] = []
        self._error: str | None = None
        self._polls_with_rows = 0
        self._frame: tuple[int, pd.DataFrame] = (0, history_frame([]))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def fetch(self, now: float) -> list[dict[str, Any]]:
        if self.source == "exporter":
            return exporter_rows(get_json(f"{self.url}/api/v1/snapshot"), now)
        return prometheus_rows(self.url, self._queries, now)

    def poll_once(self) -> None:
        try:
            rows = self.fetch(time.time())
            error = None
        except ValueError as exc:
            rows, error = [], f"{self.source} at {self.url}: {exc}"
        with self._lock:
            self._rows.extend(rows)
            del self._rows[:-MAX_ROWS]
            self._error = error
            self._polls_with_rows += bool(rows)

    def start(self) -> None:
        """Poll once now, then every interval in the background: a page opened after a sweep (nothing
        refreshes it) would otherwise say "no server-side data" while the source has it."""
        if self._thread is None:
            self.poll_once()
            self._thread = threading.Thread(target=self._loop, name=f"crossover-app-{self.source}",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll_once()

    def history(self) -> ServerHistory:
        with self._lock:
            error, key = self._error, self._polls_with_rows
            if self._frame[0] != key:  # built once per poll that brought rows, not once per page rerun
                self._frame = (key, history_frame(self._rows))
            frame = self._frame[1]
        return ServerHistory(frame, error, key)


def history_frame(rows: Sequence[dict[str, Any]]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame(columns=["time", "topology"])
    frame = pd.DataFrame(list(rows))
    frame["time"] = pd.to_datetime(frame["time"], unit="s")
    return frame.sort_values(["topology", "time"]).reset_index(drop=True)


def level_marks(marks: Sequence[LevelMark]) -> pd.DataFrame:
    """The sweep's finished levels as (time, label) rows for vertical rules on the time axis."""
    frame = pd.DataFrame([{"time": m.finished_at, "label": m.label} for m in marks],
                         columns=["time", "label"])
    frame["time"] = pd.to_datetime(frame["time"], unit="s")
    return frame
