"""The running exporter: scrape every target each interval, derive, serve /metrics and the snapshot.

`Exporter` owns the state and runs on one asyncio loop; `serve()` adds the HTTP endpoints and the
signal handlers. Tests drive `Exporter.cycle()` directly or run the whole thing in a thread with
`running_exporter()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from crossover import catalog
from crossover.errors import UserError
from crossover.exporter.collector import SnapshotCollector
from crossover.exporter.parse import Parser
from crossover.exporter.scrape import scrape
from crossover.exporter.state import Snapshot, TargetHealth, build_snapshot, empty_snapshot, snapshot_json
from crossover.exporter.targets import FileSd, PrometheusSd, all_targets
from crossover.exporter.window import History
from crossover.spec import FleetSpec, Target, load_spec

log = logging.getLogger("crossover.exporter")


def tune_gc() -> None:
    """A cycle over many targets allocates millions of small objects (parsed samples, label tuples)
    among a large long-lived heap (histories, caches); with the default thresholds the cyclic
    collector runs full passes several times per cycle (about a quarter of the CPU of a 1,000-target
    cycle, measured in benchmarks/bench_exporter.py). Almost all of it is freed by reference
    counting, so collect far less often."""
    gc.set_threshold(100_000, 50, 100)


def client_session() -> aiohttp.ClientSession:
    """The scrape client: no connection limit, DNS answers cached, gzip bodies decompressed, and
    aiohttp's own timeouts off: each scrape runs under its own `scrape.timeout` (asyncio.timeout),
    so a second timer per request would only cost CPU."""
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
    return aiohttp.ClientSession(connector=connector, auto_decompress=True, timeout=aiohttp.ClientTimeout())


class Exporter:
    def __init__(self, spec: FleetSpec, *, spec_path: str | Path | None = None,
                 file_sd_paths: list[str] | None = None, prometheus_sd_url: str | None = None) -> None:
        self.spec = spec
        self.spec_path = spec_path
        self.file_sd = FileSd(list(file_sd_paths)) if file_sd_paths else None
        # Pods from a Prometheus's target discovery (the flag, else the spec's kubernetes.prometheus_url).
        sd_url = prometheus_sd_url or spec.kubernetes.prometheus_url
        self.prometheus_sd = PrometheusSd(sd_url) if sd_url else None
        self.parser = Parser()
        self.health: dict[tuple[str, str], TargetHealth] = {}
        self.reloads: Counter[str] = Counter()
        self._token_problem: str | None = None
        self._silent_logged: set[str] = set()
        if self.file_sd is not None:
            for problem in self.file_sd.refresh(spec, force=True):
                log.warning("file_sd: %s", problem)
        self._sync_targets()
        self.snapshot: Snapshot = empty_snapshot(spec, self.targets, time.time())

    # -- targets and spec ------------------------------------------------------------------------------
    @property
    def targets(self) -> list[Target]:
        return [h.target for h in self.health.values()]

    def _keep_seconds(self) -> float:
        return max(self.spec.scrape.window_seconds) + self.spec.scrape.interval_seconds

    def _sync_targets(self) -> None:
        """Follow the spec and file_sd: keep the history of targets that stay the same."""
        wanted = all_targets(self.spec, self.file_sd, self.prometheus_sd)
        keep = self._keep_seconds()
        health: dict[tuple[str, str], TargetHealth] = {}
        for target in wanted:
            old = self.health.get(target.key)
            if old is not None and old.target == target:
                old.history.keep_seconds = keep
                health[target.key] = old
            else:
                health[target.key] = TargetHealth(target, History(keep))
        added = health.keys() - self.health.keys()
        removed = self.health.keys() - health.keys()
        if self.health and (added or removed):
            log.info("targets: %d added, %d removed, %d in all", len(added), len(removed), len(health))
        self.health = health

    def reload_spec(self) -> bool:
        """Re-read the spec file (SIGHUP). A bad new spec keeps the old one running."""
        if self.spec_path is None:
            return False
        try:
            spec = load_spec(self.spec_path)
        except UserError as exc:
            self.reloads["error"] += 1
            log.error("spec reload failed, keeping the running spec: %s", exc)
            return False
        self.spec = spec
        if self.file_sd is not None:
            for problem in self.file_sd.refresh(spec, force=True):
                log.warning("file_sd: %s", problem)
        self._sync_targets()
        self.reloads["ok"] += 1
        log.info("spec reloaded from %s: %d targets", self.spec_path, len(self.health))
        return True

    def _bearer_token(self) -> str | None:
        try:
            token = self.spec.scrape.bearer_token()
            self._token_problem = None
            return token
        except UserError as exc:
            if str(exc) != self._token_problem:
                log.error("%s; scraping without a token", exc)  # the message never holds the token
            self._token_problem = str(exc)
            return None

    # -- one cycle -------------------------------------------------------------------------------------
    async def cycle(self, session: aiohttp.ClientSession, now: float | None = None) -> Snapshot:
        """Scrape every target once (concurrently, each with its own timeout), then derive."""
        now = time.time() if now is None else now
        started = time.perf_counter()
        if self.file_sd is not None:
            problems = self.file_sd.refresh(self.spec)
            for problem in problems:
                log.warning("file_sd: %s", problem)
            self._sync_targets()
        if self.prometheus_sd is not None:
            for problem in await self.prometheus_sd.refresh(session, self.spec, time.monotonic()):
                log.warning("prometheus discovery: %s", problem)
            self._sync_targets()
        scrape_config = self.spec.scrape
        token = self._bearer_token()
        records = list(self.health.values())
        results = await asyncio.gather(*(
            scrape(session, record.target, self.parser, timeout=scrape_config.timeout_seconds,
                   max_body_bytes=scrape_config.max_body_bytes, max_series=scrape_config.max_series,
                   bearer_token=token)
            for record in records))
        for record, result in zip(records, results, strict=True):
            was_up = record.up
            record.record(result, now)
            if not record.up and (was_up or record.scrapes == 1):
                log.warning("target %s/%s down: %s", record.target.topology, record.target.instance,
                            result.error)
            elif record.up and not was_up:
                log.info("target %s/%s up", record.target.topology, record.target.instance)
        self.snapshot = build_snapshot(self.spec, records, now, cycle_seconds=time.perf_counter() - started,
                                       spec_reloads=self.reloads)
        for topology in self.snapshot.silent_entrypoints:
            if topology not in self._silent_logged:
                self._silent_logged.add(topology)
                log.warning("topology %s: its entrypoint target exposes none of %s; its request figures "
                            "come from the decode side (TTFT excludes the prefill)", topology,
                            ", ".join(m.name for m in catalog.ENTRYPOINT_FAMILIES))
        return self.snapshot

    async def run(self, stop: asyncio.Event) -> None:
        """Cycle every scrape interval until `stop` is set; a slow cycle starts the next at once."""
        async with client_session() as session:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    await self.cycle(session)
                except Exception:  # a bug must not stop the exporter; it is logged with its trace
                    log.exception("scrape cycle failed")
                delay = max(0.0, self.spec.scrape.interval_seconds - (time.monotonic() - started))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay)


# --- HTTP ---------------------------------------------------------------------------------------------
def make_app(exporter: Exporter) -> web.Application:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(lambda: exporter.snapshot))

    async def metrics(request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = await asyncio.get_running_loop().run_in_executor(None, encoder, registry)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def snapshot(request: web.Request) -> web.Response:
        document = snapshot_json(exporter.snapshot)
        return web.Response(text=json.dumps(document, separators=(",", ":")), content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/v1/snapshot", snapshot)
    app.router.add_get("/health", health)
    app.router.add_get("/-/healthy", health)
    return app


async def serve(exporter: Exporter, host: str, port: int, stop: asyncio.Event,
                started: threading.Event | None = None, handle_signals: bool = True) -> None:
    runner = web.AppRunner(make_app(exporter), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        try:
            await site.start()
        except OSError as exc:
            raise UserError(f"--port {port}: cannot listen on {host}:{port}: {exc.strerror}") from None
        loop = asyncio.get_running_loop()
        if handle_signals:
            loop.add_signal_handler(signal.SIGHUP, exporter.reload_spec)
            loop.add_signal_handler(signal.SIGTERM, stop.set)
            loop.add_signal_handler(signal.SIGINT, stop.set)
        log.info("exporter on http://%s:%d/metrics, %d targets every %s", host, port, len(exporter.health),
                 exporter.spec.scrape.interval)
        if started is not None:
            started.set()
        await exporter.run(stop)
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def running_exporter(exporter: Exporter, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """Run an exporter in a background thread (tests, the demo); yields its base URL."""
    from crossover.netutil import free_port

    port = port or free_port(host)
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    started = threading.Event()
    failure: list[BaseException] = []

    def main() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve(exporter, host, port, stop, started, handle_signals=False))
        except BaseException as exc:  # reported to the caller below
            failure.append(exc)
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="crossover-exporter", daemon=True)
    thread.start()
    started.wait(30)
    if failure:
        raise failure[0]
    try:
        yield f"http://{host}:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
