"""A topology's entrypoint: the P/D proxy (vLLM's NixlConnector flow), or a plain round-robin
balancer for a colocated topology that names an entrypoint URL.

P/D, as vLLM's toy proxy does it: send the request to a prefill instance with max_tokens=1, no
streaming and kv_transfer_params {do_remote_decode: true}; take the kv_transfer_params it answers
with and send the original request plus those to a decode instance; relay the decoder's answer
(stream or not) byte for byte. The decoder waits for the KV transfer before its first token.
"""

from __future__ import annotations

import itertools
import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from crossover.spec import Role, Topology

_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}


class EntrypointProxy:
    def __init__(self, topology: Topology) -> None:
        assert topology.entrypoint.url is not None
        self.topology = topology
        self.name = f"{topology.name}-entrypoint"
        parts = urlsplit(topology.entrypoint.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.url = topology.entrypoint.url
        roles = {i.role for i in topology.instances}
        self.disaggregated = Role.PREFILL in roles
        prefill = [i.url for i in topology.instances if i.role is Role.PREFILL]
        decode = [i.url for i in topology.instances if i.role is not Role.PREFILL]
        self._prefill = itertools.cycle(prefill) if prefill else None
        self._decode = itertools.cycle(decode)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/completions", self.forward)
        app.router.add_post("/v1/chat/completions", self.forward)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        assert self._session is not None
        async with self._session.get(next(self._decode) + "/v1/models") as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status,
                                content_type="application/json")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"object": "error", "message": "request body is not valid JSON",
                                      "type": "BadRequestError", "code": 400}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"object": "error", "message": "request body must be a JSON object",
                                      "type": "BadRequestError", "code": 400}, status=400)
        if self.disaggregated and self._prefill is not None:
            prefill_body: dict[str, Any] = {**body, "max_tokens": 1, "stream": False,
                                            "kv_transfer_params": {"do_remote_decode": True,
                                                                   "do_remote_prefill": False}}
            prefill_body.pop("stream_options", None)
            if "max_completion_tokens" in prefill_body:
                prefill_body["max_completion_tokens"] = 1
            prefill_body["min_tokens"] = 0
            try:
                async with self._session.post(next(self._prefill) + request.path, json=prefill_body) as up:
                    payload = await up.read()
                    if up.status != 200:
                        return web.Response(body=payload, status=up.status, content_type="application/json")
                    body = {**body, "kv_transfer_params": json.loads(payload).get("kv_transfer_params")}
            except aiohttp.ClientError as exc:
                return web.json_response({"object": "error", "message": f"prefill instance failed: {exc}",
                                          "type": "BadGatewayError", "code": 502}, status=502)
        return await self._relay(request, next(self._decode) + request.path, body)

    async def _relay(self, request: web.Request, url: str, body: dict[str, Any]) -> web.StreamResponse:
        assert self._session is not None
        try:
            async with self._session.post(url, json=body) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except (aiohttp.ClientError, ConnectionError):
            # The instance cut the connection (a drop fault) or the client left: cut ours the same way.
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=502)
