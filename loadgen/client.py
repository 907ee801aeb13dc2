"""One streamed /v1/completions request, timed, and the client-side balancer.

Timing follows `vllm bench serve`: TTFT is first token chunk minus send time, e2e is last token
chunk minus send time, TPOT = (e2e - TTFT) / (output_tokens - 1) (0 for one token). Unlike it, a
chunk that carries k tokens (known from `continuous_usage_stats`, or from the final usage when
the server only reports totals) yields k inter-token latencies that share the chunk's gap, so
ITLs always number output_tokens - 1 and sum to e2e - TTFT.
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from itertools import count
from typing import Any

import aiohappyeyeballs
import aiohttp
import orjson
from aiohttp.client_proto import ResponseHandler
from aiohttp.helpers import ceil_timeout
from aiohttp.streams import StreamReader

from crossover.loadgen.dataset import SyntheticRequest
from crossover.loadgen.sse import DONE, SSEOverflow, SSEParser
from crossover.loadgen.transport import KernelStampedTransport, kernel_stamps_available
from crossover.spec import Balance

_ERROR_BODY_CHARS = 200


@dataclass
class StreamTrace:
    """What the client saw of one stream, before any derived timing."""

    send_time: float
    chunk_times: list[float] = field(default_factory=list)  # unix time each token-bearing event arrived
    chunk_tokens: list[int | None] = field(default_factory=list)  # tokens per event; None if unknown
    usage_prompt_tokens: int | None = None
    usage_completion_tokens: int | None = None
    completion_id: str = ""
    status: int = 0
    error: str = ""
    done: bool = False  # saw [DONE]
    garbage: int = 0  # events that were not JSON objects we understand
    end_time: float = 0.0  # when the request finished (or failed), unix time


@dataclass
class RequestRecord:
    """One row of the requests table (times in seconds; lists relative to nothing but themselves)."""

    topology: str
    level: float
    index: int
    instance: str
    send_time: float
    end_time: float
    ok: bool
    status: int
    error: str
    ttft: float
    e2e: float
    tpot: float
    itl: list[float]
    itl_max: float
    chunk_times: list[float]  # seconds after send_time
    chunk_tokens: list[int]
    input_tokens: int
    output_tokens: int
    planned_input: int
    planned_output: int
    completion_id: str
    garbage: int


def expand_itl(chunk_offsets: list[float], chunk_tokens: list[int]) -> list[float]:
    """Per-token inter-token latencies from chunk arrival offsets and tokens per chunk.

    The first chunk's extra tokens arrived with the first token (ITL 0); a later chunk of k
    tokens after a gap g gives k latencies of g / k.
    """
    itl: list[float] = [0.0] * max(0, chunk_tokens[0] - 1) if chunk_tokens else []
    for j in range(1, len(chunk_offsets)):
        k = chunk_tokens[j]
        if k <= 0:
            continue
        gap = (chunk_offsets[j] - chunk_offsets[j - 1]) / k
        itl.extend([gap] * k)
    return itl


def _distribute(known: list[int | None], total: int | None) -> list[int]:
    """Tokens per chunk: known counts as given; unknown ones share what the total leaves (at
    least 1 each, the rest to the last chunk, where a stream that skips counts usually bunches)."""
    counts = [k if k is not None else 1 for k in known]
    unknown = [i for i, k in enumerate(known) if k is None]
    if total is not None and unknown:
        extra = total - sum(counts)
        if extra > 0:
            counts[unknown[-1]] += extra
    return counts


def build_record(trace: StreamTrace, request: SyntheticRequest, topology: str, level: float,
                 instance: str) -> RequestRecord:
    """Derive TTFT, TPOT, ITL and e2e from a trace; a request is ok only if it streamed tokens and
    finished cleanly. Failed requests keep their timing fields as NaN."""
    tokens = _distribute(trace.chunk_tokens, trace.usage_completion_tokens)
    offsets = [t - trace.send_time for t in trace.chunk_times]
    reported = trace.usage_completion_tokens
    output_tokens = reported if reported is not None else sum(tokens)
    error = trace.error
    if not error and not trace.chunk_times:
        error = "no tokens in the stream"
    if not error and not trace.done:
        error = "stream ended before [DONE]"
    if not error and output_tokens > request.output_len:
        # max_tokens bounds what a server may send; more is a broken or lying server, not work done
        error = (f"protocol violation: {output_tokens} output tokens reported, "
                 f"max_tokens was {request.output_len}")
    ok = not error and trace.status == 200
    nan = float("nan")
    if ok:
        ttft = offsets[0]
        e2e = offsets[-1]
        tpot = (e2e - ttft) / (output_tokens - 1) if output_tokens > 1 else 0.0
        itl = expand_itl(offsets, tokens)
    else:
        ttft = e2e = tpot = nan
        itl = []
    return RequestRecord(
        topology=topology, level=level, index=request.index, instance=instance,
        send_time=trace.send_time, end_time=trace.end_time or trace.send_time, ok=ok,
        status=trace.status, error=error, ttft=ttft, e2e=e2e, tpot=tpot, itl=itl,
        itl_max=max(itl) if itl else (0.0 if ok else nan), chunk_times=offsets, chunk_tokens=tokens,
        input_tokens=(trace.usage_prompt_tokens if trace.usage_prompt_tokens is not None
                      else request.input_len),
        output_tokens=output_tokens if ok else 0, planned_input=request.input_len,
        planned_output=request.output_len, completion_id=trace.completion_id, garbage=trace.garbage)


def _role_only(choice: object) -> bool:
    """A chat event whose delta carries no text (the assistant role chunk, or an empty delta)."""
    if not isinstance(choice, dict) or "delta" not in choice:
        return False
    delta = choice["delta"]
    return not (isinstance(delta, dict) and (delta.get("content") or delta.get("reasoning_content")))


def _consume_event(trace: StreamTrace, data: bytes, now: float) -> None:
    if data == DONE:
        trace.done = True
        return
    try:
        event = orjson.loads(data)  # the client's hot path: about 4x json.loads per event
    except (ValueError, UnicodeDecodeError):
        trace.garbage += 1
        return
    if not isinstance(event, dict):
        trace.garbage += 1
        return
    if "error" in event and "choices" not in event:
        detail = event["error"]
        message = detail.get("message", detail) if isinstance(detail, dict) else detail
        trace.error = f"error event: {str(message)[:_ERROR_BODY_CHARS]}"
        return
    usage = event.get("usage")
    completion_tokens = None
    if isinstance(usage, dict):
        completion_tokens = usage.get("completion_tokens")
        if not isinstance(completion_tokens, int):
            completion_tokens = None
        prompt_tokens = usage.get("prompt_tokens")
        if isinstance(prompt_tokens, int):
            trace.usage_prompt_tokens = prompt_tokens
    choices = event.get("choices")
    if not trace.completion_id and isinstance(event.get("id"), str):
        trace.completion_id = event["id"]
    if isinstance(choices, list) and choices:
        if completion_tokens is not None:
            # continuous usage stats: the running total tells how many tokens this event carried
            previous = trace.usage_completion_tokens or 0
            tokens: int | None = completion_tokens - previous
        else:
            tokens = None
        if tokens is None and _role_only(choices[0]):
            tokens = 0  # a chat stream's first event: the assistant role, no content yet
        if tokens is None or tokens > 0:
            trace.chunk_times.append(now)
            trace.chunk_tokens.append(tokens)
    elif choices is not None and not isinstance(choices, list):
        trace.garbage += 1
    if completion_tokens is not None:
        trace.usage_completion_tokens = completion_tokens


@dataclass(frozen=True)
class ClientOptions:
    """How the sweep's client reads streams (the defaults are the fastest and most exact; the
    others exist to measure against): uvloop runs the event loop when installed; in_protocol
    parses events in the connection's data_received instead of in each stream's coroutine;
    kernel_stamps times reads with the kernel's receive time instead of time.time()."""

    uvloop: bool = True
    in_protocol: bool = True
    kernel_stamps: bool = True


class _StreamSink:
    """One stream's parser, fed by its connection's protocol as the body's bytes arrive: the
    events are parsed and stamped inside data_received, and the stream's coroutine wakes once, at
    the end, instead of once per read."""

    __slots__ = ("body", "feeding", "parser", "trace")

    def __init__(self, body: Any, parser: SSEParser, trace: StreamTrace) -> None:
        self.body = body
        self.parser = parser
        self.trace = trace
        self.feeding = False

    def feed(self, now: float) -> None:
        body = self.body
        # nothing new, already failed, or called again from inside read_nowait (which resumes a
        # paused protocol, whose resume_reading calls data_received)
        if not body._buffer or body._exception is not None or self.feeding:
            return
        self.feeding = True
        try:
            data = body.read_nowait(-1)
            for event in self.parser.feed(data):
                _consume_event(self.trace, event, now)
        except SSEOverflow as exc:
            body.set_exception(exc)  # the coroutine, waiting for the end, raises it
        finally:
            self.feeding = False


class StampingResponseHandler(ResponseHandler):
    """aiohttp's connection protocol, noting when each socket read arrived and how far into the
    response body it reached: (body bytes so far, unix time); with a stream's sink attached, it
    parses the events itself as they arrive.

    Why: a coroutine reading the stream runs after every other ready coroutine, so at hundreds of
    streams whose tokens arrive in the same engine step, a time taken there is late by the time
    the others took (milliseconds). data_received runs as the bytes come off the socket, and with
    KernelStampedTransport `read_stamp` is the kernel's receive time of the read.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.stamps: list[tuple[int, float]] = []
        self.stamped_body: object = None
        self.sink: _StreamSink | None = None
        self.read_stamp: float | None = None  # set by KernelStampedTransport before each read

    def resume_reading(self, resume_parser: bool = True) -> None:
        # The body's StreamReader calls this after every read that leaves it below its low-water
        # mark, paused or not; unpaused, aiohttp's resume only re-enters data_received(b"") (to
        # finish a parse that a pause cut short, and a pause sets the flag) at a cost per event.
        if self._reading_paused or getattr(self, "_buffer_paused", True):
            super().resume_reading(resume_parser)

    def data_received(self, data: bytes) -> None:
        now = self.read_stamp or time.time()
        before = self._payload
        super().data_received(data)
        body = self._payload or before  # the body may end (and be let go) in this read
        if body is None:
            return
        sink = self.sink
        if sink is not None and sink.body is body:
            sink.feed(now)
            return
        if body is not self.stamped_body:  # a new response on a kept-alive connection
            self.stamped_body = body
            self.stamps = []
        self.stamps.append((body.total_bytes, now))


class StampingConnector(aiohttp.TCPConnector):
    """A TCPConnector whose plain-TCP connections are KernelStampedTransport (each read carries the
    kernel's receive time); TLS, other platforms, or aiohttp internals that differ from what this
    was written against get the loop's own transport, and reads are stamped in user space."""

    async def _wrap_create_connection(self, *args: Any, addr_infos: Any, req: Any, timeout: Any,
                                      client_error: type[Exception] = aiohttp.ClientConnectorError,
                                      **kwargs: Any) -> tuple[asyncio.Transport, ResponseHandler]:
        if kwargs.get("ssl") or not _KERNEL_STAMPS:
            return await super()._wrap_create_connection(
                *args, addr_infos=addr_infos, req=req, timeout=timeout, client_error=client_error, **kwargs)
        try:
            async with ceil_timeout(timeout.sock_connect, ceil_threshold=timeout.ceil_threshold):
                sock = await aiohappyeyeballs.start_connection(
                    addr_infos=addr_infos, local_addr_infos=self._local_addr_infos,
                    happy_eyeballs_delay=self._happy_eyeballs_delay, interleave=self._interleave,
                    loop=self._loop, socket_factory=self._socket_factory)
        except OSError as exc:
            if exc.errno is None and isinstance(exc, asyncio.TimeoutError):
                raise
            raise client_error(req.connection_key, exc) from exc
        protocol = args[0]()
        try:
            transport = KernelStampedTransport(self._loop, sock, protocol)
        except OSError as exc:
            sock.close()
            raise client_error(req.connection_key, exc) from exc
        return transport, protocol


def _kernel_stamps_usable() -> bool:
    names = ("_local_addr_infos", "_happy_eyeballs_delay", "_interleave", "_socket_factory")
    probe = aiohttp.TCPConnector.__init__.__code__.co_names
    return kernel_stamps_available() and all(n in probe for n in names)


_KERNEL_STAMPS = _kernel_stamps_usable()


def stamping_connector(*, kernel_stamps: bool = True, **kwargs: Any) -> aiohttp.TCPConnector:
    """A connector whose connections stamp reads (see StampingResponseHandler), with the kernel's
    receive times where it can (StampingConnector); where aiohttp's internals differ, a plain
    connector, and reads are stamped when the coroutine sees them."""
    connector = (StampingConnector if kernel_stamps else aiohttp.TCPConnector)(**kwargs)
    loop = getattr(connector, "_loop", None)
    if loop is not None and hasattr(connector, "_factory"):
        connector._factory = functools.partial(StampingResponseHandler, loop=loop)  # type: ignore[assignment]
    return connector


def _read_stamps(protocol: object, body: object, start: int, end: int) -> list[tuple[int, float]]:
    """The read stamps of `body` covering its bytes (start, end], oldest first; consumed ones
    dropped. Empty when the connection does not stamp, or already carries another response."""
    if not isinstance(protocol, StampingResponseHandler) or protocol.stamped_body is not body:
        return []
    stamps = protocol.stamps
    keep = 0
    while keep < len(stamps) and stamps[keep][0] <= start:
        keep += 1
    covering = [s for s in stamps[keep:] if s[0] <= end]
    after = stamps[keep + len(covering):]
    if after:  # the read that completed `end` is still needed for the next bytes
        covering.append(after[0])
    protocol.stamps = stamps[keep:]
    return covering


def _feed_stamped(parser: SSEParser, trace: StreamTrace, chunk: bytes, start: int,
                  stamps: list[tuple[int, float]], fallback: float) -> None:
    """Feed a body chunk to the parser in pieces cut where socket reads ended, so each event gets
    the time of the read that completed it."""
    position = 0
    for offset, stamp in stamps:
        cut = min(offset - start, len(chunk))
        if cut <= position:
            continue
        for data in parser.feed(chunk[position:cut]):
            _consume_event(trace, data, stamp)
        position = cut
    if position < len(chunk):
        for data in parser.feed(chunk[position:]):
            _consume_event(trace, data, fallback)


def _attach_sink(protocol: StampingResponseHandler, body: Any, parser: SSEParser,
                 trace: StreamTrace) -> _StreamSink | None:
    """Parse what arrived before now by the protocol's notes of its reads, and have the protocol
    parse the rest as it arrives; None if the body had all arrived already."""
    early = body.read_nowait(-1)
    _feed_stamped(parser, trace, early, 0, _read_stamps(protocol, body, 0, len(early)), time.time())
    if body.is_eof():  # all of it was here; the connection may already serve another response
        return None
    sink = _StreamSink(body, parser, trace)
    protocol.sink = sink
    return sink


async def _read_in_protocol(protocol: StampingResponseHandler, body: Any, parser: SSEParser,
                            trace: StreamTrace) -> None:
    """The body is parsed by the protocol as it arrives (_StreamSink); this waits for its end."""
    sink = _attach_sink(protocol, body, parser, trace)
    if sink is None:
        return
    try:
        await body.wait_eof()
        late = body.read_nowait(-1)  # raises the body's error, if it failed
        if late:  # fed without a read (aiohttp flushing its parser at the connection's end)
            now = time.time()
            for data in parser.feed(late):
                _consume_event(trace, data, now)
    finally:
        if protocol.sink is sink:
            protocol.sink = None


async def _read_in_coroutine(protocol: object, body: Any, parser: SSEParser, trace: StreamTrace) -> None:
    """The plain aiohttp way: the coroutine reads the body, using the protocol's read stamps where
    there are some."""
    consumed = 0
    async for chunk in body.iter_any():
        now = time.time()
        end = consumed + len(chunk)
        stamps = _read_stamps(protocol, body, consumed, end)
        _feed_stamped(parser, trace, chunk, consumed, stamps, now)
        consumed = end


async def stream_completion(session: aiohttp.ClientSession, base_url: str, payload: bytes,
                            timeout_s: float, *, in_protocol: bool = True,
                            path: str = "/v1/completions") -> StreamTrace:
    """POST one streaming completion and record when each token event arrives. Never raises for
    what the server or network does: every failure ends up in trace.error. On a stamping
    connection the events are parsed in the protocol (in_protocol), otherwise by this coroutine."""
    trace = StreamTrace(send_time=time.time())
    parser = SSEParser()
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(base_url + path, data=payload,
                                    headers={"Content-Type": "application/json"}) as response:
                trace.status = response.status
                if response.status != 200:
                    body = (await response.content.read(4096)).decode(errors="replace")
                    trace.error = f"HTTP {response.status}: {' '.join(body.split())[:_ERROR_BODY_CHARS]}"
                else:
                    # Held from the start: at the body's end aiohttp lets the connection go
                    # (response.connection becomes None) before the last bytes are read here.
                    protocol = response.connection.protocol if response.connection is not None else None
                    content = response.content
                    if (in_protocol and isinstance(protocol, StampingResponseHandler)
                            and protocol.stamped_body is content and isinstance(content, StreamReader)):
                        await _read_in_protocol(protocol, content, parser, trace)
                    else:
                        await _read_in_coroutine(protocol, content, parser, trace)
                    for data in parser.finish():
                        _consume_event(trace, data, time.time())
    except TimeoutError:
        trace.error = f"timeout after {timeout_s:g} s"
    except SSEOverflow as exc:
        trace.error = f"not an event stream: {exc}"
    except aiohttp.ClientError as exc:
        trace.error = f"{type(exc).__name__}: {str(exc)[:_ERROR_BODY_CHARS]}"
    except OSError as exc:
        trace.error = f"{type(exc).__name__}: {exc}"
    trace.garbage += parser.garbage
    trace.end_time = time.time()
    return trace


class Balancer:
    """Client-side balancing over a topology's instances, like a Kubernetes Service in front of
    replicas: round_robin, or least_outstanding (fewest requests in flight, ties in turn)."""

    def __init__(self, urls: list[str], policy: Balance) -> None:
        if not urls:
            raise ValueError("a balancer needs at least one URL")
        self.urls = list(urls)
        self.policy = policy
        self.outstanding = dict.fromkeys(self.urls, 0)
        self._turn = count()

    def acquire(self) -> str:
        turn = next(self._turn)
        n = len(self.urls)
        if self.policy is Balance.ROUND_ROBIN:
            url = self.urls[turn % n]
        else:
            rotated = [self.urls[(turn + i) % n] for i in range(n)]
            url = min(rotated, key=self.outstanding.__getitem__)
        self.outstanding[url] += 1
        return url

    def release(self, url: str) -> None:
        self.outstanding[url] -= 1
