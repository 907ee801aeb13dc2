"""http_requests_total as the simulator and the P/D proxy count it (crossover.exposition.http_counter):
one rule for both, as vLLM 0.32's API server counts."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from crossover.exposition import http_counter


async def _answers(counted: list[tuple[str, str, int]]) -> dict[str, int]:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def refused(request: web.Request) -> web.Response:
        raise web.HTTPTooManyRequests()

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("the handler failed")

    app = web.Application(middlewares=[http_counter(lambda *key: counted.append(key))])
    app.router.add_get("/v1/models", ok)
    app.router.add_post("/v1/completions", refused)
    app.router.add_post("/v1/chat/completions", broken)
    app.router.add_get("/metrics", ok)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    statuses = {}
    try:
        async with aiohttp.ClientSession() as session:
            for method, path in (("GET", "/v1/models"), ("POST", "/v1/completions"),
                                 ("POST", "/v1/chat/completions"), ("GET", "/metrics"),
                                 ("GET", "/no/such/path")):
                async with session.request(method, f"http://127.0.0.1:{port}{path}") as response:
                    statuses[path] = response.status
    finally:
        await runner.cleanup()
    return statuses


def test_counts_the_served_paths_by_the_status_answered_raised_or_failed() -> None:
    counted: list[tuple[str, str, int]] = []
    statuses = asyncio.run(_answers(counted))
    assert statuses == {"/v1/models": 200, "/v1/completions": 429, "/v1/chat/completions": 500,
                        "/metrics": 200, "/no/such/path": 404}
    # /metrics and stray paths are not counted: a client's typos must not add series.
    assert counted == [("/v1/models", "GET", 200), ("/v1/completions", "POST", 429),
                       ("/v1/chat/completions", "POST", 500)]
