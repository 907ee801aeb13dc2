"""Small loopback servers for the fault tests: an aiohttp application on a 127.0.0.1 port,
run on its own thread's event loop for the length of a `with` block (stopped on failure too).

The simulator covers most faults; these serve what it does not: SSE garbage, a 50 MB /metrics,
a 10,000-label-set burst, 5xx on /metrics and a target that demands a bearer token.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from aiohttp import web

from crossover.sim import tokenizer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class LoopbackApp:
    """A running application: its base URL and the requests it saw (method, path, headers)."""

    url: str
    port: int
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)


@contextmanager
def serving(routes: Mapping[tuple[str, str], Handler], start_timeout: float = 10.0) -> Iterator[LoopbackApp]:
    """Serve {(method, path): handler} on a 127.0.0.1 port the OS picks as it binds, until the block ends."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    served = LoopbackApp(f"http://127.0.0.1:{port}", port)

    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        served.seen.append((request.method, request.path, dict(request.headers)))
        return await handler(request)

    app = web.Application(middlewares=[record], client_max_size=8 * 1024 * 1024)
    for (method, path), handler in routes.items():
        app.router.add_route(method, path, handler)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
    thread = threading.Thread(target=loop.run_forever, name=f"faults-app-{port}", daemon=True)
    thread.start()

    async def start() -> None:
        await runner.setup()
        await web.SockSite(runner, listener).start()

    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(start_timeout)
        yield served
    finally:
        try:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(start_timeout)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(start_timeout)
            loop.close()
            listener.close()  # closed with the site once it started; not if it never did


def exposition(families: dict[str, list[tuple[dict[str, str], float]]], kind: str = "gauge") -> bytes:
    """Prometheus text format for {metric name: [(labels, value)]} (names as given)."""
    lines: list[str] = []
    for name, samples in families.items():
        lines.append(f"# HELP {name} test metric\n# TYPE {name} {kind}\n")
        for labels, value in samples:
            inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines.append(f"{name}{{{inner}}} {value!r}\n")
    return "".join(lines).encode()


async def _tokenize(request: web.Request) -> web.StreamResponse:
    ids = tokenizer.encode_prompt((await request.json())["prompt"])
    return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})


async def _detokenize(request: web.Request) -> web.StreamResponse:
    return web.json_response({"prompt": tokenizer.decode((await request.json())["tokens"])})


def tokenizer_routes(*prefixes: str) -> dict[tuple[str, str], Handler]:
    """vLLM's /tokenize and /detokenize under each prefix, counting as the simulator counts, so the
    sweep can plan exact prompt lengths against these servers."""
    return {("POST", f"{prefix}{path}"): handler for prefix in prefixes
            for path, handler in (("/tokenize", _tokenize), ("/detokenize", _detokenize))}
