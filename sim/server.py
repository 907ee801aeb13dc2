"""One simulated vLLM instance: the OpenAI-compatible HTTP surface over a live engine.

Streaming responses are written straight to the connection from the engine's step pass (chunked
framing done here, after aiohttp has sent the headers): one SSE chunk per token, no task switch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import uuid
import zlib
from array import array
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError

from crossover import catalog
from crossover.exposition import http_counter
from crossover.sim import tokenizer
from crossover.sim.engine import GAP_RING, LiveEngine
from crossover.sim.metrics import InstanceMetrics, legacy_mode, malformed, render, version_at_least
from crossover.sim.model import PerfModel
from crossover.sim.scheduler import SimRequest, chained_block_hashes
from crossover.sim.writer import WritePath
from crossover.spec import Fault, FleetSpec, Instance, Role, Topology

RECORD_RING = 20_000
_GAP_MASK = GAP_RING - 1
_WORDS = [w.encode() for w in (" the", " model", " serves", " tokens", " in", " steps", " of", " a",
                                " batch", " and", " each", " one", " is", " streamed", " back", " now")]
_MAX_METRICS_STALL_S = 600.0


def answer_text(tokens: int) -> str:
    """The text of an answer of `tokens` tokens, as streamed (StreamSink.prepare: token i is word i + 1):
    a conversation's next turn carries it back in its history, so the ground truth hashes it too."""
    return "".join(_WORDS[(i + 1) & 15].decode() for i in range(tokens))


def record_view(record: dict[str, Any]) -> dict[str, Any]:
    """A finished request's record as `/admin/requests` shows it (token times as a list)."""
    return {**record, "token_times": array("d", record["token_times"]).tolist()}


class BadRequest(Exception):
    """A request the OpenAI API would answer with 400; the message names the field."""


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
    return web.json_response(body, status=status)


def count_prompt_tokens(prompt: Any) -> int:
    """Prompt tokens as the simulator counts them (sim/tokenizer.py); an empty text counts as one."""
    return max(1, len(tokenizer.encode_prompt(prompt)))


def count_chat_tokens(messages: Any) -> int:
    return len(tokenizer.encode_chat(messages))


def prompt_keys(body: dict[str, Any], *, chat: bool) -> list[Any]:
    """The prompt as the tokens the counts above see (words, ids, 4 template tokens per chat message):
    what the prefix cache hashes, block by block."""
    if not chat:
        prompt = body["prompt"]
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        return prompt.split() if isinstance(prompt, str) else list(prompt)
    keys: list[Any] = []
    for message in body["messages"]:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        keys += ["<|start|>", str(message.get("role")), "<|content|>", *str(content).split(), "<|end|>"]
    return keys


def _int_field(body: dict[str, Any], name: str, default: int | None, minimum: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise BadRequest(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


class StreamSink:
    """Writes one request's SSE chunks to its connection as the engine emits tokens (the hot path:
    one bytes join per token, then the stream's output writes it: sim/writer.py). The stream ends
    (`done`) only once its last chunk is out, so that what the handler writes after it through the
    transport comes after it."""

    __slots__ = ("chat", "continuous_usage", "done", "drop_after", "dropped", "engine", "head", "output",
                 "prompt", "request", "tail", "times", "unix_offset")

    def __init__(self, engine: LiveEngine, path: WritePath, transport: asyncio.Transport, request: SimRequest,
                 *, chat: bool, head: bytes, prompt: int, continuous_usage: bool, drop_after: int | None,
                 record: dict[str, Any]) -> None:
        self.engine = engine
        self.request = request
        self.chat = chat
        self.head = b"data: " + head
        self.tail = b'"},"logprobs":null,"finish_reason":' if chat else \
            b'","logprobs":null,"finish_reason":'
        self.prompt = prompt
        self.continuous_usage = continuous_usage
        self.drop_after = drop_after
        self.dropped = False
        self.times: array[float] = record["token_times"]
        self.unix_offset = time.time() - time.monotonic()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # the drop fault cuts the stream from the loop after its token, so it is written there
        self.output = path.output(transport, self, on_loop=drop_after is not None)

    def prepare(self, request: SimRequest, index: int, finishing: bool) -> None:
        finish = b'"' + request.finish_reason.encode() + b'"' if finishing else b"null"
        if self.continuous_usage:
            usage = (b',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}}\n\n'
                     % (self.prompt, self.prompt + index, index))
        else:
            usage = b"}\n\n"
        body = b"".join((self.head, _WORDS[index & 15], self.tail, finish,
                         b"}]" if self.chat else b',"stop_reason":null}]', usage))
        if self.chat and index == 1:  # vLLM sends the assistant role in its own chunk with the first token
            body = (self.head[: -len(b'"content":"')]
                    + b'"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n' + body)
        request.pending = b"%x\r\n%s\r\n" % (len(body), body)

    def on_token(self, request: SimRequest, step_end: float) -> None:
        """The step's end, on the loop: write the token unless the write path took it over."""
        chunk = request.pending
        if not chunk:
            return  # taken over: the output reports it (written)
        request.pending = b""
        output = self.output
        if output.closing():
            self.engine.abort(request)
            self._finish()
            return
        output.write(chunk, step_end)
        if self.drop_after is not None and request.generated >= self.drop_after and not request.finished:
            self.dropped = True
            self.engine.abort(request)
            output.cut()
            self._finish()

    def written(self, at: float, step_end: float) -> None:
        self.times.append(at + self.unix_offset)
        gap = at - step_end
        engine = self.engine
        engine.emission_gaps[engine.emission_count & _GAP_MASK] = gap if gap >= 0 else -gap
        engine.emission_count += 1

    def lost(self) -> None:
        self.engine.abort(self.request)
        self.dropped = True
        self.output.when_flushed(self._finish)

    def on_finish(self, request: SimRequest) -> None:
        self.output.when_flushed(self._finish)  # the stream ends once its last chunk is out

    def cut(self) -> None:
        """Cut the connection now (a restart, a drop, the server stopping)."""
        self.dropped = True
        self.output.cut()
        self._finish()

    def settle(self) -> None:
        """The handler is leaving (done, or cancelled when its client went away)."""
        self.output.close()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)


class WaitSink:
    """A non-streaming request: just wait for the end."""

    __slots__ = ("done", "output", "record")

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.output = None  # nothing to write until the end
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def prepare(self, request: SimRequest, index: int, finishing: bool) -> None:
        pass

    def on_token(self, request: SimRequest, step_end: float) -> None:
        self.record["token_times"].append(time.time())

    def on_finish(self, request: SimRequest) -> None:
        if not self.done.done():
            self.done.set_result(None)


class SimInstance:
    """A simulated vLLM server for one instance of the spec, listening on its URL's loopback port."""

    def __init__(self, spec: FleetSpec, topology: Topology, instance: Instance) -> None:
        self.spec = spec
        self.topology = topology
        self.instance = instance
        self.name = instance.name
        parts = urlsplit(instance.url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.model_name = spec.model.name
        self.perf = PerfModel.for_instance(spec, topology.tp_of(instance))
        self.metrics = InstanceMetrics(spec.model.name, spec.model.max_model_len, self._queue_state,
                                       kv_connector=None if instance.role is Role.COLOCATED
                                       else catalog.KV_CONNECTORS[spec.simulator.kv_connector],
                                       request_preemptions=version_at_least(
                                           spec.simulator.vllm_version,
                                           catalog.REQUEST_NUM_PREEMPTIONS_SINCE))
        self.engine = LiveEngine(self.perf, self.metrics, spec.simulator.time_scale)
        self.path = WritePath()  # the write path, from start
        self.current_names, self.legacy_names = legacy_mode(spec.simulator.vllm_version)
        self.rng = random.Random(spec.simulator.seed * 1_000_003 + zlib.crc32(self.name.encode()))
        self.records: deque[dict[str, Any]] = deque(maxlen=RECORD_RING)
        self.fault = Fault()
        self.set_fault(spec.simulator.faults.get(self.name, Fault()))
        self.created = int(time.time())
        self._runner: web.AppRunner | None = None
        self._live: set[StreamSink | WaitSink] = set()

    def _queue_state(self):  # type: ignore[no-untyped-def]
        return self.engine.queue_state()

    # --- lifecycle -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024,
                              middlewares=[http_counter(self.metrics.on_http)])
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics_endpoint)
        app.router.add_get("/admin/faults", self.get_faults)
        app.router.add_post("/admin/faults", self.post_faults)
        app.router.add_get("/admin/requests", self.get_requests)
        app.router.add_get("/admin/stats", self.get_stats)
        return app

    async def start(self, path: WritePath | None = None) -> None:
        """Serve, streamed tokens written the way `path` says (the default: from the loop)."""
        if path is not None:
            self.path = path
        self.engine.start(self.path)
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=4096, reuse_address=True)
        await site.start()

    async def stop(self) -> None:
        for sink in list(self._live):
            if isinstance(sink, StreamSink):
                sink.cut()
            elif not sink.done.done():
                sink.done.set_result(None)
        await self.engine.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # --- faults --------------------------------------------------------------------------------
    def set_fault(self, fault: Fault) -> None:
        self.fault = fault
        self.engine.slowdown = fault.slowdown

    def restart(self) -> None:
        """What a process restart looks like from outside: open streams cut, counters back to zero."""
        for request in self.engine.reset():
            sink = request.sink
            if isinstance(sink, StreamSink):
                sink.cut()
            elif sink is not None and not sink.done.done():
                sink.done.set_result(None)
        self.metrics.reset()
        self.records.clear()
        self.created = int(time.time())

    # --- OpenAI API ----------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def _serve(self, http: web.Request, *, chat: bool) -> web.StreamResponse:
        error = bool(self.fault.error_rate) and self.rng.random() < self.fault.error_rate
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        try:
            parsed = self._parse(body, chat=chat)
        except (BadRequest, tokenizer.TokenizeError) as exc:
            return _error(400, str(exc))
        model = body.get("model", self.model_name)
        if model != self.model_name:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        prompt_tokens, output_tokens, finish_reason, stream, include_usage, continuous, kv_params = parsed
        if error:
            # An engine error as vLLM counts one: finished with reason "error", observed in the
            # per-finished-request histograms, answered 500.
            now = time.monotonic()
            self.metrics.on_engine_error(arrival=now, now=now, prompt_tokens=prompt_tokens)
            return _error(500, "simulated engine error (fault error_rate)", "InternalServerError")
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        arrival_unix = time.time()
        record: dict[str, Any] = {"id": request_id, "arrival": arrival_unix, "token_times": array("d"),
                                  "prompt_tokens": prompt_tokens, "output_tokens": 0}
        remote_kv = bool(kv_params and kv_params.get("do_remote_prefill")
                         and self.instance.role is Role.DECODE)
        sim = SimRequest(request_id, prompt_tokens, output_tokens, time.monotonic(), finish_reason,
                         remote_kv=remote_kv, block_hashes=chained_block_hashes(
                             prompt_keys(body, chat=chat), self.perf.block_size))
        drop_after = None
        if self.fault.drop_rate and self.rng.random() < self.fault.drop_rate:
            drop_after = self.rng.randint(1, max(1, output_tokens - 1)) if output_tokens > 1 else 1
        if stream:
            return await self._stream(http, sim, record, chat=chat, include_usage=include_usage,
                                      continuous=continuous, drop_after=drop_after)
        sink = WaitSink(record)
        sim.sink = sink
        self._live.add(sink)
        try:
            self.engine.submit(sim)
            await sink.done
        except asyncio.CancelledError:  # the client went away
            self.engine.abort(sim)
            raise
        finally:
            self._live.discard(sink)
        if drop_after is not None or not sim.finished or sim.generated < sim.output_tokens:
            if http.transport is not None:
                http.transport.abort()
            return web.Response(status=500)
        self._record(record, sim)
        text = answer_text(sim.generated)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + sim.generated,
                 "completion_tokens": sim.generated, "prompt_tokens_details": None}
        choice: dict[str, Any]
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                      "logprobs": None, "finish_reason": sim.finish_reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": sim.finish_reason,
                      "stop_reason": None, "prompt_logprobs": None}
        response: dict[str, Any] = {
            "id": request_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(arrival_unix), "model": self.model_name, "choices": [choice], "usage": usage}
        if kv_params and kv_params.get("do_remote_decode") and self.instance.role is Role.PREFILL:
            response["kv_transfer_params"] = {
                "do_remote_prefill": True, "do_remote_decode": False,
                "remote_block_ids": list(range(self.perf.blocks_for(prompt_tokens))),
                "remote_engine_id": self.name, "remote_host": self.host, "remote_port": self.port,
                "tp_size": self.topology.tp_of(self.instance)}
        return web.json_response(response)

    async def _stream(self, http: web.Request, sim: SimRequest, record: dict[str, Any], *, chat: bool,
                      include_usage: bool, continuous: bool, drop_after: int | None) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        response.enable_chunked_encoding()
        await response.prepare(http)
        transport = http.transport
        if transport is None:
            return response
        created = int(record["arrival"])
        if chat:
            head = (b'{"id":"%s","object":"chat.completion.chunk","created":%d,"model":%s,'
                    b'"choices":[{"index":0,"delta":{"content":"'
                    % (sim.request_id.encode(), created, json.dumps(self.model_name).encode()))
        else:
            head = (b'{"id":"%s","object":"text_completion","created":%d,"model":%s,'
                    b'"choices":[{"index":0,"text":"'
                    % (sim.request_id.encode(), created, json.dumps(self.model_name).encode()))
        sink = StreamSink(self.engine, self.path, transport, sim, chat=chat, head=head,
                          prompt=sim.prompt_tokens, continuous_usage=continuous, drop_after=drop_after,
                          record=record)
        sim.sink = sink
        self._live.add(sink)
        try:
            self.engine.submit(sim)
            await sink.done
        except asyncio.CancelledError:  # the client went away
            self.engine.abort(sim)
            raise
        finally:
            self._live.discard(sink)
            sink.settle()
        if sink.dropped or transport.is_closing():
            return response
        self._record(record, sim)
        try:
            if include_usage:
                total = sim.prompt_tokens + sim.generated
                usage = {"prompt_tokens": sim.prompt_tokens, "total_tokens": total,
                         "completion_tokens": sim.generated}
                kind = "chat.completion.chunk" if chat else "text_completion"
                chunk = {"id": sim.request_id, "object": kind, "created": created, "model": self.model_name,
                         "choices": [], "usage": usage}
                await response.write(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except ConnectionError:
            pass  # the client left right after its last token: nothing left to tell it
        return response

    def _record(self, record: dict[str, Any], sim: SimRequest) -> None:
        # The ring keeps a copy the collector does not track: a dict of atoms only (the token times as
        # bytes, not an array), so the 20,000 records per instance neither count towards the young
        # collection's threshold while the ring fills (2 tracked objects per request did: a 70-110 ms
        # young collection every 30-40 s at 2,000 streams) nor get scanned by it.
        self.records.append({"id": record["id"], "arrival": record["arrival"],
                             "token_times": record["token_times"].tobytes(),
                             "prompt_tokens": record["prompt_tokens"], "output_tokens": sim.generated})

    def _parse(self, body: dict[str, Any], *, chat: bool) -> tuple[int, int, str, bool, bool, bool,
                                                                   dict[str, Any] | None]:
        if chat:
            prompt_tokens = count_chat_tokens(body.get("messages"))
        else:
            if "prompt" not in body:
                raise BadRequest("prompt is required")
            prompt_tokens = count_prompt_tokens(body["prompt"])
        if body.get("n", 1) != 1:
            raise BadRequest(f"n must be 1 (one choice per request is simulated), got {body.get('n')!r}")
        max_len = self.spec.model.max_model_len
        if prompt_tokens >= max_len:
            raise BadRequest(f"This model's maximum context length is {max_len} tokens. However, your "
                             f"request has {prompt_tokens} input tokens.")
        room = max_len - prompt_tokens
        max_tokens = _int_field(body, "max_completion_tokens" if chat and "max_completion_tokens" in body
                                else "max_tokens", None if chat else 16, 1)
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise BadRequest(f"max_tokens ({max_tokens}) plus the prompt ({prompt_tokens} tokens) exceeds "
                             f"the maximum context length {max_len}")
        min_tokens = _int_field(body, "min_tokens", 0, 0) or 0
        if min_tokens > max_tokens:
            raise BadRequest(f"min_tokens ({min_tokens}) must not exceed max_tokens ({max_tokens})")
        ignore_eos = bool(body.get("ignore_eos", False))
        if ignore_eos:
            output_tokens = max_tokens
        else:
            drawn = 1 + int(self.rng.expovariate(1.0 / self.spec.simulator.mean_output_tokens))
            output_tokens = min(max_tokens, max(min_tokens, drawn))
        finish_reason = "length" if output_tokens >= max_tokens else "stop"
        if self.perf.blocks_for(prompt_tokens + output_tokens) > self.perf.kv_capacity_blocks:
            raise BadRequest(f"the request needs {prompt_tokens + output_tokens} tokens of KV cache but the "
                             f"instance holds {self.perf.kv_capacity_tokens}")
        stream = bool(body.get("stream", False))
        options = body.get("stream_options") or {}
        if not isinstance(options, dict):
            raise BadRequest("stream_options must be an object")
        kv_params = body.get("kv_transfer_params")
        if kv_params is not None and not isinstance(kv_params, dict):
            raise BadRequest("kv_transfer_params must be an object")
        return (prompt_tokens, output_tokens, finish_reason, stream, bool(options.get("include_usage")),
                bool(options.get("continuous_usage_stats")), kv_params)

    async def _json_body(self, http: web.Request) -> dict[str, Any]:
        try:
            body = await http.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequest("request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        model = body.get("model", self.model_name)
        if model is not None and model != self.model_name:
            raise BadRequest(f"The model `{model}` does not exist.")
        return body

    async def tokenize(self, http: web.Request) -> web.Response:
        """vLLM's POST /tokenize: a prompt or chat messages, counted as the completions endpoints count."""
        try:
            body = await self._json_body(http)
            ids = (tokenizer.encode_chat(body["messages"]) if "messages" in body
                   else tokenizer.encode_prompt(body.get("prompt")))
        except (BadRequest, tokenizer.TokenizeError) as exc:
            return _error(400, str(exc))
        return web.json_response({"count": len(ids), "max_model_len": self.spec.model.max_model_len,
                                  "tokens": ids, "token_strs": None})

    async def detokenize(self, http: web.Request) -> web.Response:
        try:
            body = await self._json_body(http)
            ids = body.get("tokens")
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise BadRequest("tokens must be a list of token ids")
        except BadRequest as exc:
            return _error(400, str(exc))
        return web.json_response({"prompt": tokenizer.decode(ids)})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{
            "id": self.model_name, "object": "model", "created": self.created, "owned_by": "vllm",
            "root": self.model_name, "parent": None, "max_model_len": self.spec.model.max_model_len,
            "permission": []}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    # --- /metrics ------------------------------------------------------------------------------
    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        waited = 0.0
        while self.fault.stall_metrics and waited < _MAX_METRICS_STALL_S:
            await asyncio.sleep(0.05)
            waited += 0.05
        fault = self.fault
        if fault.legacy_names:
            payload = render(self.metrics, current=False, legacy=True)
        else:
            payload = render(self.metrics, current=self.current_names, legacy=self.legacy_names)
        if fault.malformed_metrics:
            payload = malformed(payload)
        if fault.truncated_metrics:
            # Announce the whole payload, send half of it, then cut the connection mid-line.
            response = web.StreamResponse(headers={"Content-Type": CONTENT_TYPE_LATEST})
            response.content_length = len(payload)
            await response.prepare(request)
            with contextlib.suppress(ConnectionError):
                await response.write(payload[: len(payload) // 2])
            if request.transport is not None:
                request.transport.abort()
            return response
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE_LATEST})

    # --- admin ---------------------------------------------------------------------------------
    async def get_faults(self, request: web.Request) -> web.Response:
        return web.json_response(self.fault.model_dump())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object of fault fields")
        restart = body.pop("restart", False)
        if not isinstance(restart, bool):
            return _error(400, f"restart must be true or false, got {restart!r}")
        try:
            fault = Fault.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first["loc"])
            message = "unknown field" if first["type"] == "extra_forbidden" else first["msg"]
            return _error(400, f"fault {where}: {message}")
        self.set_fault(fault)
        if restart:
            self.restart()
        return web.json_response(self.fault.model_dump())

    async def get_requests(self, request: web.Request) -> web.Response:
        """The ring of finished requests; `?since=UNIX` keeps those that arrived at or after it and
        `?limit=N` the last N (the whole ring of long streams is tens of MB of JSON)."""
        try:
            since = float(request.query.get("since", "-inf"))
            limit = int(request.query.get("limit", str(RECORD_RING)))
        except ValueError:
            return _error(400, "since must be a unix time and limit an integer")
        records = [r for r in self.records if r["arrival"] >= since][-limit:] if limit > 0 else []
        return web.json_response([record_view(r) for r in records])

    def emission_stats(self) -> dict[str, float]:
        n = min(self.engine.emission_count, len(self.engine.emission_gaps))
        if not n:
            return {"count": 0}
        # A copy of the ring's filled part, then a partial sort in numpy: this runs on the loop that
        # is streaming, and sorting 65,536 floats in Python would hold it up for ~10 ms.
        gaps = np.frombuffer(self.engine.emission_gaps, dtype=np.float64, count=n).copy()
        p50, p99 = n // 2, min(n - 1, int(n * 0.99))
        gaps.partition([p50, p99, n - 1])
        return {"count": self.engine.emission_count, "p50_s": float(gaps[p50]),
                "p99_s": float(gaps[p99]), "max_s": float(gaps[n - 1])}

    async def get_stats(self, request: web.Request) -> web.Response:
        """Emission-gap percentiles and queue sizes; `?reset=1` starts a new measurement window."""
        reset = request.query.get("reset") in ("1", "true")
        stats = {"instance": self.name, "emission_gaps": self.emission_stats(),
                 "running": self.engine.scheduler.num_running, "waiting": self.engine.scheduler.num_waiting,
                 **self.path.stats(reset)}
        if reset:
            self.engine.emission_count = 0
        return web.json_response(stats)
