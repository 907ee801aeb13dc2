"""One scrape of one target over HTTP: timeout, bearer token, body-size limit, gzip, parse.

Never raises for a target's fault: every failure comes back as a `ScrapeResult` with a reason
from `ERROR_REASONS`, so one broken target never stops the others. The bearer token goes into
the request header only; no message built here contains it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from crossover import catalog
from crossover.exporter import dialect
from crossover.exporter.parse import ParsedSeries, ParseError, Parser
from crossover.spec import ENTRYPOINT_ROLE, Target

# The `reason` label values of crossover_scrape_errors_total.
ERROR_REASONS: tuple[str, ...] = ("timeout", "connection", "http_status", "too_large", "read", "parse",
                                  "too_many_series", "router_series")

ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,"
          "text/plain;version=0.0.4;q=0.9,*/*;q=0.1")


@dataclass(frozen=True)
class ScrapeResult:
    target: Target
    duration: float  # seconds from request to parsed payload (or failure)
    series: ParsedSeries | None  # None when the scrape failed
    reason: str | None = None  # one of ERROR_REASONS when it failed
    error: str | None = None  # one line for logs and the snapshot
    body_bytes: int = 0
    # An entrypoint serving no known dialect: what it does serve, for the one fallback log line.
    served: str | None = None

    @property
    def ok(self) -> bool:
        return self.series is not None


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The (decompressed) body, or None once it exceeds limit bytes."""
    length = response.content_length
    if length is not None and not response.headers.get("Content-Encoding"):
        # A plain body of announced size: one read, refused up front when too large.
        return None if length > limit else await response.read()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def scrape(session: aiohttp.ClientSession, target: Target, parser: Parser, *, timeout: float,
                 max_body_bytes: int, max_series: int | None = None,
                 bearer_token: str | None = None) -> ScrapeResult:
    started = time.perf_counter()
    headers = {"Accept": ACCEPT, "Accept-Encoding": "gzip"}
    if bearer_token:
        headers["Authorization"] = f"Bearer {bearer_token}"

    def failed(reason: str, error: str, size: int = 0) -> ScrapeResult:
        return ScrapeResult(target, time.perf_counter() - started, None, reason, error, size)

    try:
        async with asyncio.timeout(timeout):
            async with session.get(target.metrics_url, headers=headers, allow_redirects=False) as response:
                if response.status != 200:
                    return failed("http_status", f"HTTP {response.status} from {target.metrics_url}")
                body = await _read_limited(response, max_body_bytes)
                if body is None:
                    return failed("too_large", f"body over {max_body_bytes} bytes from {target.metrics_url}")
                charset = response.charset or "utf-8"
    except TimeoutError:
        return failed("timeout", f"no complete answer within {timeout:g} s from {target.metrics_url}")
    except aiohttp.ClientPayloadError as exc:
        return failed("read", f"broken body from {target.metrics_url}: {type(exc).__name__}")
    except (aiohttp.ClientConnectionError, OSError) as exc:
        return failed("connection", f"cannot connect to {target.metrics_url}: {type(exc).__name__}")
    except aiohttp.ClientError as exc:
        return failed("read", f"bad answer from {target.metrics_url}: {type(exc).__name__}")
    try:
        text = body.decode(charset)
    except (UnicodeDecodeError, LookupError):
        return failed("parse", f"body from {target.metrics_url} is not {charset} text", len(body))
    try:
        series = parser.parse(text)
    except ParseError as exc:
        return failed("parse", f"{target.metrics_url}: {exc}", len(body))
    if max_series is not None and len(series.keys) > max_series:
        distinct = len(series.unique().keys)
        if distinct > max_series:
            # A burst of label sets would swell the history and corrupt the topology sums: refuse it.
            return failed("too_many_series", f"{target.metrics_url}: {distinct} series of the families read, "
                          f"over the limit of {max_series} (scrape.max_series)", len(body))
    series, refused = dialect.read(target, series)
    if refused is not None:
        return failed("router_series", refused, len(body))
    served = None
    if target.role == ENTRYPOINT_ROLE and not any(catalog.REQUEST_SUCCESS.sample_names[0] == key[0]
                                                  or key[0].startswith(_ENTRY_HISTOGRAMS)
                                                  for key in series.keys):
        served = dialect.served_families(text)
    return ScrapeResult(target, time.perf_counter() - started, series, body_bytes=len(body), served=served)


_ENTRY_HISTOGRAMS = tuple(m.name + "_" for m in catalog.ENTRYPOINT_FAMILIES
                          if m.type is catalog.MetricType.HISTOGRAM)
