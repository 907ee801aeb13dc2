"""A tiny OpenAI-style streaming server on loopback, in its own thread, for the load generator's
tests: well-behaved streams, several tokens per event, garbage, HTTP errors, hangs and drops.

It records, like the simulator's /admin/requests, when each event was written, so tests can
compare the client's timing with the server's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from crossover.sim import tokenizer
from crossover.spec import FleetSpec, load_spec, parse_spec
from tests.helpers import SPECS


@dataclass
class Behaviour:
    ttft_s: float = 0.01
    tpot_s: float = 0.002
    tokens_per_event: int = 1
    continuous_usage: bool = True  # usage in every event when the client asks for it
    final_usage: bool = True
    garbage: bool = False  # interleave comments, junk lines and broken JSON
    status: int = 200
    hang: bool = False  # never send anything after the headers
    drop_after: int | None = None  # close the connection after this many events
    no_done: bool = False
    crlf: bool = False
    error_event: bool = False
    per_token_s: float = 0.0  # extra delay per concurrent stream (a crude saturation model)


@dataclass
class Recorded:
    id: str
    arrival: float
    token_times: list[float] = field(default_factory=list)  # each event's write returned
    # Each event's write began: the client cannot see it earlier. The time after the write can be
    # late by a GIL hand-over to the client thread of the same process (5 ms switch interval).
    write_starts: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int = 0


class FakeServer:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        # bound now, port read back: no other process can take the port before the server listens
        self._socket = socket.create_server(("127.0.0.1", 0), backlog=1024)
        self.port = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.recorded: list[Recorded] = []
        self.bodies: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._counter = 0

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        b = self.behaviour
        arrival = time.time()
        body = await request.json()
        self.bodies.append(body)
        if b.status != 200:
            return web.Response(status=b.status, text=json.dumps({"error": {"message": "overloaded"}}))
        self._counter += 1
        record = Recorded(id=f"cmpl-{self._counter}", arrival=arrival,
                          prompt_tokens=len(tokenizer.encode_prompt(body["prompt"])))
        self.recorded.append(record)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        end = b"\r\n\r\n" if b.crlf else b"\n\n"
        continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        try:
            if b.hang:
                await asyncio.sleep(3600)
            await asyncio.sleep(b.ttft_s)
            total = int(body["max_tokens"])
            sent = 0
            events = 0
            while sent < total:
                k = min(b.tokens_per_event, total - sent)
                sent += k
                event: dict[str, Any] = {"id": record.id, "object": "text_completion",
                                         "choices": [{"index": 0, "text": " w1" * k, "finish_reason": None}]}
                if continuous and b.continuous_usage:
                    event["usage"] = {"prompt_tokens": record.prompt_tokens, "completion_tokens": sent,
                                      "total_tokens": record.prompt_tokens + sent}
                if b.garbage:
                    await response.write(b": keep-alive" + end + b"nonsense line" + end
                                         + b"data: {broken json" + end + b"data: [1, 2]" + end)
                data = b"data: " + json.dumps(event).encode() + end
                record.write_starts.append(time.time())
                await response.write(data)
                record.token_times.append(time.time())
                record.output_tokens = sent
                events += 1
                if b.drop_after is not None and events >= b.drop_after:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                if sent < total:
                    await asyncio.sleep(b.tpot_s * k + b.per_token_s * self.in_flight)
            if b.error_event:
                await response.write(b'data: {"error": {"message": "engine died"}}' + end)
            if b.final_usage:
                usage = {"id": record.id, "choices": [], "usage": {
                    "prompt_tokens": record.prompt_tokens, "completion_tokens": sent,
                    "total_tokens": record.prompt_tokens + sent}}
                await response.write(b"data: " + json.dumps(usage).encode() + end)
            if not b.no_done:
                await response.write(b"data: [DONE]" + end)
            await response.write_eof()
        finally:
            self.in_flight -= 1
        return response

    async def _tokenize(self, request: web.Request) -> web.Response:
        """Counts as the simulator does (one word, one token), like vLLM's /tokenize answers."""
        ids = tokenizer.encode_prompt((await request.json())["prompt"])
        return web.json_response({"count": len(ids), "max_model_len": 4096, "tokens": ids})

    async def _detokenize(self, request: web.Request) -> web.Response:
        return web.json_response({"prompt": tokenizer.decode((await request.json())["tokens"])})

    async def _admin_requests(self, request: web.Request) -> web.Response:
        return web.json_response([vars(r) for r in self.recorded])

    def _serve(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/admin/requests", self._admin_requests)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        self._runner = web.AppRunner(app, handle_signals=False)
        loop.run_until_complete(self._runner.setup())
        site = web.SockSite(self._runner, self._socket)
        loop.run_until_complete(site.start())
        self._ready.set()
        loop.run_forever()
        pending = asyncio.all_tasks(loop)  # hanging handlers: cancel them rather than wait
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(self._runner.cleanup())
        loop.close()

    def __enter__(self) -> FakeServer:
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextmanager
def fake_fleet(behaviour: Callable[[str], Behaviour]) -> Iterator[tuple[FleetSpec, dict[str, FakeServer]]]:
    """cpu-real-vllm.yaml's shape (one instance vs two balanced) on fake servers; `behaviour` gives
    each topology's (by name). Yields the spec pointing at them and the servers by instance name."""
    data = load_spec(SPECS / "cpu-real-vllm.yaml").model_dump(mode="json")
    with ExitStack() as stack:
        servers = {}
        for topology in data["topologies"]:
            for instance in topology["instances"]:
                server = stack.enter_context(FakeServer(behaviour(topology["name"])))
                instance["url"] = server.url
                servers[instance["name"]] = server
        yield parse_spec(data), servers
