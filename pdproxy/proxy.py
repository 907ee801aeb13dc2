"""A topology's entrypoint: the P/D proxy (vLLM's NixlConnector flow), or a plain round-robin
balancer for a colocated topology that names an entrypoint URL.

P/D, as vLLM's toy proxy does it: send the request to a prefill instance with max_tokens=1, no
streaming and kv_transfer_params {do_remote_decode: true}; take the kv_transfer_params it answers
with and send the original request plus those to a decode instance; relay the decoder's answer
(stream or not) byte for byte. The decoder waits for the KV transfer before its first token.

The proxy is where a P/D request is one request: its /metrics serves vLLM-compatible families
(EntrypointMetrics) timed from the request's arrival here, so the exporter and the rules can count
each request once and report the TTFT its user waited for (prefill, KV transfer and decode).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric as PromFamily

from crossover import catalog, slo
from crossover.exposition import Hist, family, http_counter, http_key
from crossover.loadgen.traffic.sse import DONE, SSEOverflow, SSEParser
from crossover.spec import Role, Topology

# A non-streamed answer is kept (up to this size) only to read its finish reason.
_MAX_KEPT_BODY = 1 << 20
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "date", "server"}


# The outcome the entrypoint records beside the finish reasons a stream reports: an instance
# failed, answered 5xx or cut the stream. A client that leaves gets none (crossover.slo: as vLLM).
ERROR = "error"


class EntrypointMetrics:
    """vLLM's request-level families as the entrypoint sees them, counted as vLLM 0.32 counts them
    (crossover.slo): TTFT from the request's arrival at the proxy to its first streamed token, ITL
    between streamed tokens, TPOT per request, e2e latency, finished requests by reason (an
    instance's failure as "error", observed in e2e like any finished request) and answered requests
    by handler and status class. A client that leaves mid-stream has TTFT and ITL of the tokens it
    got and no finished reason, e2e or TPOT. TTFT, ITL and TPOT need a streamed response.

    In another dialect (catalog.DIALECTS, the spec's entrypoint.dialect) the same requests are
    served as that router counts them (docs/routers.md): llm-d's router counts a request once it is
    routed (request_total), its failures by error_code (an instance's non-200 answer or cut stream is
    ModelServerError, bad input BadRequest), TTFT of every answered request with a `streaming`
    label (a non-streamed one's is its duration), ITL and TPOT of streamed ones, and serves the
    deprecated inference_objective_ names beside its own; production-stack's router counts
    arrivals, errors and a router-side latency."""

    def __init__(self, model_name: str, dialect: str = catalog.VLLM_DIALECT.name) -> None:
        self.dialect = catalog.DIALECTS[dialect]
        self.model_name = model_name
        self.labels = {"model_name": model_name, "engine": "0"}
        self.created = time.time()
        self.success = dict.fromkeys(catalog.FINISHED_REASONS, 0)
        own = self.dialect if self.dialect is not catalog.PRODUCTION_STACK_DIALECT else catalog.VLLM_DIALECT

        def hist(metric: catalog.Metric) -> Hist:
            return Hist((own.histogram_for(metric) or metric).buckets, self.created)

        self.ttft = hist(catalog.TTFT)
        self.ttft_unstreamed = hist(catalog.TTFT)
        self.itl = hist(catalog.ITL)
        self.tpot = hist(catalog.TPOT)
        self.e2e = Hist((self.dialect.histogram_for(catalog.E2E_LATENCY) or catalog.E2E_LATENCY).buckets,
                        self.created)
        self.http: dict[tuple[str, str, str], int] = {}  # (handler, method, status class) -> requests
        self.routed = 0  # a router's request counter (llm-d: counted once routed; production-stack: arrivals)
        self.errors: dict[str, int] = {}  # a router's errors by its error label's value

    def on_http(self, handler: str, method: str, status: int) -> None:
        key = http_key(handler, method, status)
        self.http[key] = self.http.get(key, 0) + 1

    def arrived(self) -> None:
        """A request with a valid body, about to be sent to the instances."""
        self.routed += 1

    def refused(self, status: int) -> None:
        """A request refused before routing (bad input): only llm-d's router counts it, as BadRequest."""
        if self.dialect.client_errors and slo.is_client_error(status):
            self.errors[self.dialect.client_errors[0]] = self.errors.get(self.dialect.client_errors[0], 0) + 1

    def finished(self, reason: str | None, arrival: float, end: float, tokens: list[float],
                 streamed: bool = True) -> None:
        """One request: its finish reason (None: the client left), arrival and end times, and each
        streamed token's time."""
        if reason == ERROR and self.dialect.errors is not None:
            code = "ModelServerError" if self.dialect.client_errors else "server_error"
            self.errors[code] = self.errors.get(code, 0) + 1
        if tokens:
            self.ttft.observe(tokens[0] - arrival)
            for previous, current in itertools.pairwise(tokens):
                self.itl.observe(current - previous)
        elif not streamed and reason is not None and reason != ERROR:
            self.ttft_unstreamed.observe(end - arrival)
        if reason is None:
            return
        self.success[reason] = self.success.get(reason, 0) + 1
        self.e2e.observe(end - arrival)
        self.tpot.observe((tokens[-1] - tokens[0]) / (len(tokens) - 1) if len(tokens) > 1 else 0.0)

    def collect(self) -> Iterator[PromFamily]:
        if self.dialect is catalog.LLMD_DIALECT:
            yield from self._llmd(legacy=False)
            yield from self._llmd(legacy=True)
            return
        if self.dialect is catalog.LLMD_LEGACY_DIALECT:
            yield from self._llmd(legacy=True)
            return
        if self.dialect is catalog.PRODUCTION_STACK_DIALECT:
            yield from self._production_stack()
            return
        values: dict[str, object] = {
            catalog.REQUEST_SUCCESS.name: {k: float(v) for k, v in self.success.items()},
            catalog.TTFT.name: self.ttft, catalog.ITL.name: self.itl, catalog.TPOT.name: self.tpot,
            catalog.E2E_LATENCY.name: self.e2e,
            catalog.HTTP_REQUESTS.name: {k: float(v) for k, v in self.http.items()},
        }
        for metric in (*catalog.ENTRYPOINT_FAMILIES, catalog.HTTP_REQUESTS):
            yield family(metric, metric.name, self.labels, self.created, values[metric.name])

    def _llmd(self, legacy: bool) -> Iterator[PromFamily]:
        """llm-d's router families (its llm_d_epp_ ones, or the deprecated inference_objective_ ones
        it serves beside them); the simulator serves one flow at the default priority."""
        dialect = catalog.LLMD_LEGACY_DIALECT if legacy else catalog.LLMD_DIALECT
        labels = {"model_name": self.model_name, "target_model_name": self.model_name,
                  "fairness_id": catalog.LLMD_DEFAULT_FAIRNESS_ID, "priority": "0"}
        assert dialect.requests is not None and dialect.errors is not None
        yield family(dialect.requests, dialect.requests.name, labels, self.created, float(self.routed))
        yield family(dialect.errors, dialect.errors.name, labels, self.created,
                     {code: float(n) for code, n in self.errors.items()})
        e2e = dialect.histogram_for(catalog.E2E_LATENCY)
        assert e2e is not None
        yield family(e2e, e2e.name, labels, self.created, self.e2e)
        if legacy:
            return  # the legacy TTFT needs the predicted-latency plugin; no ITL or TPOT
        ttft = catalog.LLMD_TTFT
        streamed = family(ttft, ttft.name, {**labels, "streaming": "true"}, self.created, self.ttft)
        unstreamed = family(ttft, ttft.name, {**labels, "streaming": "false"}, self.created,
                            self.ttft_unstreamed)
        streamed.samples.extend(unstreamed.samples)
        yield streamed
        for vllm, hist in ((catalog.ITL, self.itl), (catalog.TPOT, self.tpot)):
            metric = dialect.histogram_for(vllm)
            assert metric is not None
            yield family(metric, metric.name, labels, self.created, hist)

    def _production_stack(self) -> Iterator[PromFamily]:
        """production-stack's router families for the requests relayed (router-side e2e, arrivals,
        errors), and engine gauges under vLLM's names with its `server` label, as it serves them."""
        labels = {"server": "simulated", "model": self.model_name, "status": "200"}
        dialect = catalog.PRODUCTION_STACK_DIALECT
        assert dialect.requests is not None and dialect.errors is not None
        yield family(dialect.requests, dialect.requests.name, labels, self.created, float(self.routed))
        yield family(dialect.errors, dialect.errors.name, labels, self.created,
                     {code: float(n) for code, n in self.errors.items()})
        latency = catalog.PRODUCTION_STACK_LATENCY
        yield family(latency, latency.name, labels, self.created, self.e2e)
        qps = catalog.PRODUCTION_STACK_QPS
        yield family(qps, qps.name, labels, self.created, 0.0)
        for gauge in catalog.PRODUCTION_STACK_ENGINE_GAUGES:  # what makes it dangerous beside the engines
            yield family(gauge, gauge.name, labels, self.created, 0.0)

    def render(self) -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return generate_latest(registry)


class _Stream:
    """Reads a relayed server-sent-event stream on the side: when each token event passed, and the
    finish reason. The loadgen's SSEParser splits the events, whatever the chunking and line ends."""

    def __init__(self) -> None:
        self.parser: SSEParser | None = SSEParser()
        self.tokens: list[float] = []
        self.reason: str | None = None

    def feed(self, chunk: bytes, now: float) -> None:
        if self.parser is None:
            return
        try:
            events = self.parser.feed(chunk)
        except SSEOverflow:
            # Not SSE after all: stop reading on the side (the relay goes on, byte for byte), and
            # a stream that never said why it ended counts as an error.
            self.parser = None
            return
        for data in events:
            self._data(data, now)

    def finish(self, now: float) -> None:
        """The stream ended: a last event without its blank line still counts."""
        if self.parser is not None:
            for data in self.parser.finish():
                self._data(data, now)

    def _data(self, data: bytes, now: float) -> None:
        if not data or data == DONE:
            return
        try:
            payload = json.loads(data)
        except ValueError:
            return
        choices = payload.get("choices") if isinstance(payload, dict) else None
        if not choices:
            return  # the usage-only chunk of stream_options.include_usage
        self.tokens.append(now)
        for choice in choices:
            if isinstance(choice, dict) and choice.get("finish_reason"):
                self.reason = str(choice["finish_reason"])


def _finish_reason(payload: bytes) -> str | None:
    """The finish reason of a non-streamed completion."""
    try:
        choices = json.loads(payload).get("choices") or []
        return str(choices[0].get("finish_reason") or "") or None
    except (ValueError, AttributeError, IndexError, TypeError):
        return None


class EntrypointProxy:
    def __init__(self, topology: Topology, model_name: str = "") -> None:
        assert topology.entrypoint.url is not None
        self.topology = topology
        self.name = f"{topology.name}-entrypoint"
        parts = urlsplit(topology.entrypoint.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.url = topology.entrypoint.url
        # P/D: prefill, then decode; colocated: round robin over every instance, as decoders.
        self.prefill = [i.url for i in topology.instances if i.role is Role.PREFILL]
        self.decode = [i.url for i in topology.instances if i.role is not Role.PREFILL]
        self._prefill = itertools.cycle(self.prefill)
        self._decode = itertools.cycle(self.decode)
        self.metrics = EntrypointMetrics(model_name, topology.entrypoint.dialect or catalog.VLLM_DIALECT.name)
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024,
                              middlewares=[http_counter(self.metrics.on_http)])
        app.router.add_post("/v1/completions", self.forward)
        app.router.add_post("/v1/chat/completions", self.forward)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.serve_metrics)
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

    async def serve_metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def models(self, request: web.Request) -> web.Response:
        assert self._session is not None
        async with self._session.get(next(self._decode) + "/v1/models") as upstream:
            return web.Response(body=await upstream.read(), status=upstream.status,
                                content_type="application/json")

    async def forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        arrival = time.perf_counter()
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.metrics.refused(400)
            return web.json_response({"object": "error", "message": "request body is not valid JSON",
                                      "type": "BadRequestError", "code": 400}, status=400)
        if not isinstance(body, dict):
            self.metrics.refused(400)
            return web.json_response({"object": "error", "message": "request body must be a JSON object",
                                      "type": "BadRequestError", "code": 400}, status=400)
        self.metrics.arrived()
        if self.topology.disaggregated:
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
                        self._failed(up.status, arrival)
                        return web.Response(body=payload, status=up.status, content_type="application/json")
                    body = {**body, "kv_transfer_params": json.loads(payload).get("kv_transfer_params")}
            except aiohttp.ClientError as exc:
                self._failed(502, arrival)
                return web.json_response({"object": "error", "message": f"prefill instance failed: {exc}",
                                          "type": "BadGatewayError", "code": 502}, status=502)
        return await self._relay(request, next(self._decode) + request.path, body, arrival)

    def _failed(self, status: int, arrival: float) -> None:
        """A request the instances refused: a failure, unless it was refused as bad input (a 4xx
        but 408 and 429), the client's own mistake, which vLLM does not count either (crossover.slo)."""
        if status >= 400 and (not slo.is_client_error(status) or self.metrics.dialect.client_errors):
            # llm-d's router counts any non-200 answer of an instance as ModelServerError.
            self.metrics.finished(ERROR, arrival, time.perf_counter(), [])

    async def _relay(self, request: web.Request, url: str, body: dict[str, Any],
                     arrival: float) -> web.StreamResponse:
        assert self._session is not None
        stream = _Stream()
        streamed = bool(body.get("stream"))
        payload = b""
        client_left = False
        prepared: web.StreamResponse | None = None
        try:
            async with self._session.post(url, json=body) as upstream:
                response = web.StreamResponse(status=upstream.status, headers={
                    k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS})
                await response.prepare(request)
                prepared = response
                async for chunk in upstream.content.iter_any():
                    if upstream.status == 200:
                        if streamed:
                            stream.feed(chunk, time.perf_counter())
                        elif len(payload) < _MAX_KEPT_BODY:
                            payload += chunk
                    client_left = True
                    await response.write(chunk)
                    client_left = False
                await response.write_eof()
            stream.finish(time.perf_counter())
        except (aiohttp.ClientError, ConnectionError):
            # The instance cut the connection (a drop fault) or the client left: cut ours the same way.
            self.metrics.finished(None if client_left else ERROR, arrival, time.perf_counter(), stream.tokens)
            if request.transport is not None:
                request.transport.abort()
            return prepared or web.Response(status=502)
        end = time.perf_counter()
        if upstream.status != 200:
            self._failed(upstream.status, arrival)
            return response
        reason = stream.reason if streamed else _finish_reason(payload)
        if reason is None:
            reason = ERROR  # a 200 answer that never said why it ended was cut short
        elif reason not in catalog.FINISHED_REASONS:
            reason = "stop"  # an API's own stop reasons (tool_calls) are vLLM's stop
        self.metrics.finished(reason, arrival, end, stream.tokens, streamed)
        return response
