"""Heavy bad /metrics targets in their own process (`python -m tests.faults.faults_heavy_server
--port N`), so that pushing 50 MB bodies never starves the simulator in the test's process:

    /big/metrics      50 MB of valid exposition text, with Content-Length
    /chunked/metrics  the same 50 MB, chunked (no length known up front)
    /bomb/metrics     the same 50 MB gzip-compressed to ~5 MB (Content-Encoding: gzip)
    /burst/metrics    once switched on (POST /admin/burst): a cardinality burst, 10,000 label sets
                      of a gauge the exporter reads, with label values that change on every
                      scrape (a request id leaking into labels); a real payload before that
    /healthy/metrics  a real vLLM 0.32.0 payload
    /admin/heal       POST: the 50 MB paths serve the healthy payload from now on
    /admin/calm       POST: the burst ends; /burst/metrics serves the healthy payload again

Loopback only. It exits when its parent (the test) dies, so no process is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import sys
from pathlib import Path

from aiohttp import web

from crossover import catalog

BIG_BYTES = 50 * 1024 * 1024
BURST_SERIES = 10_000
HEALTHY = (Path(__file__).resolve().parent.parent / "fixtures" / "vllm-0.32.0-under-load.prom").read_bytes()


def filler(size: int) -> bytes:
    """Valid exposition text of a family nobody reads, exactly `size` bytes (whole lines, padded)."""
    head = b"# TYPE filler_metric gauge\n"
    # one block of 100,000 lines built in Python, then copied with another block label (C speed)
    block = b"".join(b'filler_metric{block="BLOCK",i="%05d"} 1\n' % i for i in range(100_000))
    blocks = [head]
    length = len(head)
    number = 0
    while length + len(block) < size - 2:
        blocks.append(block.replace(b"BLOCK", b"%05d" % number))
        length += len(block)
        number += 1
    body = b"".join(blocks)
    return body + b"#" * (size - len(body) - 1) + b"\n"


def burst_payload(scrape: int) -> bytes:
    name = catalog.NUM_REQUESTS_RUNNING.name
    lines = [f"# TYPE {name} gauge\n"]
    lines.extend(f'{name}{{engine="{i}",model_name="leak-{scrape}-{i}"}} 1.0\n' for i in range(BURST_SERIES))
    return "".join(lines).encode()


def make_app() -> web.Application:
    big = filler(BIG_BYTES)
    bomb = gzip.compress(big, 6)
    state = {"healed": False, "burst": False, "scrapes": 0}

    async def healthy_or(request: web.Request, serve: web.Response | None) -> web.StreamResponse:
        if state["healed"] or serve is None:
            return web.Response(body=HEALTHY, content_type="text/plain")
        return serve

    async def big_handler(request: web.Request) -> web.StreamResponse:
        return await healthy_or(request, web.Response(body=big, content_type="text/plain"))

    async def chunked(request: web.Request) -> web.StreamResponse:
        if state["healed"]:
            return await healthy_or(request, None)
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            for start in range(0, len(big), 1 << 20):
                await response.write(big[start:start + (1 << 20)])
            await response.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the exporter hung up at its limit, as it should
        return response

    async def bomb_handler(request: web.Request) -> web.StreamResponse:
        return await healthy_or(request, web.Response(
            body=bomb, headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"}))

    async def burst(request: web.Request) -> web.StreamResponse:
        if not state["burst"]:
            return web.Response(body=HEALTHY, content_type="text/plain")
        state["scrapes"] += 1
        return web.Response(body=burst_payload(state["scrapes"]), content_type="text/plain")

    async def heal(request: web.Request) -> web.Response:
        state["healed"] = True
        return web.Response(text="healed\n")

    async def start_burst(request: web.Request) -> web.Response:
        state["burst"] = True
        return web.Response(text="bursting\n")

    async def calm(request: web.Request) -> web.Response:
        state["burst"] = False
        return web.Response(text="calm\n")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    app = web.Application()
    app.router.add_get("/big/metrics", big_handler)
    app.router.add_get("/chunked/metrics", chunked)
    app.router.add_get("/bomb/metrics", bomb_handler)
    app.router.add_get("/burst/metrics", burst)
    app.router.add_get("/healthy/metrics", lambda r: healthy_or(r, None))
    app.router.add_post("/admin/heal", heal)
    app.router.add_post("/admin/burst", start_burst)
    app.router.add_post("/admin/calm", calm)
    app.router.add_get("/health", health)
    return app


async def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    parent = os.getppid()

    async def start(app: web.Application) -> None:
        app["watch"] = asyncio.ensure_future(_watch_parent(parent))

    app = make_app()
    app.on_startup.append(start)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
