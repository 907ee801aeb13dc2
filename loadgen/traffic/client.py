"""One streamed /v1/completions request, timed, and the client-side balancer.

Timing follows `vllm bench serve`: TTFT is first token chunk minus send time, e2e is last token
chunk minus send time, TPOT = (e2e - TTFT) / (output_tokens - 1) (0 for one token). Unlike it, a
chunk that carries k tokens (known from `continuous_usage_stats`, or from the final usage when
the server only reports totals) yields k inter-token latencies that share the chunk's gap, so
ITLs always number output_tokens - 1 and sum to e2e - TTFT.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from itertools import count

import orjson

from crossover import slo
from crossover.loadgen.traffic.dataset import SyntheticRequest
from crossover.loadgen.traffic.httpclient import ClientError, HTTPClient
from crossover.loadgen.traffic.sse import DONE, SSEOverflow, SSEParser
from crossover.spec import Balance

_ERROR_BODY_CHARS = 200
_ERROR_BODY_BYTES = 4096


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
    shared_reads: int = 0  # token events that came in one socket read with another (see _CompletionSink)
    text: list[str] | None = None  # the streamed text, kept only when asked (a conversation's next turn)


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
    shared_reads: int  # token events stamped with a read they shared: their stamps may be late


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
        tpot = slo.tpot(e2e - ttft, output_tokens)
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
        planned_output=request.output_len, completion_id=trace.completion_id, garbage=trace.garbage,
        shared_reads=trace.shared_reads)


def _keep_text(text: list[str], choice: object) -> None:
    if isinstance(choice, dict):
        delta = choice.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(piece, str):
            text.append(piece)


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
        if trace.text is not None:
            _keep_text(trace.text, choices[0])
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
    others exist to measure against): uvloop runs the event loop when installed; kernel_stamps
    times reads with the kernel's receive time instead of time.time() in data_received;
    preconnect opens the connections before the first request instead of on it."""

    uvloop: bool = True
    kernel_stamps: bool = True
    preconnect: bool = True  # closed loop: open every stream's connection before the level's first send


# Reads a stream keeps before parsing them (the sink's `reads`): bounds its memory (64 reads of a
# few hundred bytes) and keeps the batch's parsing hot in the CPU's caches.
PARSE_BATCH = 64


class _CompletionSink:
    """One stream's response, fed by its connection as the bytes arrive (loadgen/traffic/httpclient.py): each
    read is kept with its time, and its events are parsed later, in batches, each stamped with the
    time of the read that completed it.

    Why the time in the protocol: a coroutine reading the stream runs after every other ready
    coroutine, so at hundreds of streams whose tokens arrive in the same engine step, a time taken
    there is late by the time the others took (milliseconds); data_received runs as the bytes come
    off the socket, and on plain TCP its time is the kernel's receive time of the read.
    Why the parse later: a token event wakes the client from sleep with its caches cold, where
    parsing one event costs several times what it costs in a batch (benchmarks/bench_clients.py
    measures the client's CPU per request); only the read and its time are needed on arrival."""

    __slots__ = ("error_body", "parser", "reads", "streaming", "trace")

    def __init__(self, trace: StreamTrace) -> None:
        self.trace = trace
        self.parser = SSEParser()
        self.streaming = False
        self.error_body = b""
        self.reads: list[tuple[bytes, float]] = []

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.trace.status = status
        self.streaming = status == 200

    def feed(self, data: bytes, stamp: float) -> bool:
        if self.streaming:
            reads = self.reads
            reads.append((data, stamp))
            if len(reads) >= PARSE_BATCH:
                self.parse()
            return False
        self.error_body += data
        return len(self.error_body) >= _ERROR_BODY_BYTES

    def parse(self) -> None:
        """Parse the reads kept so far into the trace (SSEOverflow for a stream that is not SSE)."""
        trace, parser = self.trace, self.parser
        reads, self.reads = self.reads, []
        for data, stamp in reads:
            before = len(trace.chunk_times)
            for event in parser.feed(data):
                _consume_event(trace, event, stamp)
            # Events that waited in the socket together share its one kernel stamp, the last
            # arrival's: the earlier ones read late (by up to the gaps between them).
            if len(trace.chunk_times) - before > 1:
                trace.shared_reads += len(trace.chunk_times) - before

    def finish(self) -> None:
        """The response ended: its reads parsed, a last event without its blank line, or the
        error's body."""
        trace = self.trace
        if self.streaming:
            self.parse()
            now = time.time()
            for event in self.parser.finish():
                _consume_event(trace, event, now)
        elif trace.status:
            body = self.error_body[:_ERROR_BODY_BYTES].decode(errors="replace")
            trace.error = f"HTTP {trace.status}: {' '.join(body.split())[:_ERROR_BODY_CHARS]}"


_JSON = {"Content-Type": "application/json"}


async def stream_completion(client: HTTPClient, base_url: str, payload: bytes, timeout_s: float, *,
                            path: str = "/v1/completions", keep_text: bool = False) -> StreamTrace:
    """POST one streaming completion and record when each token event arrives. Never raises for
    what the server or network does: every failure ends up in trace.error."""
    trace = StreamTrace(send_time=time.time(), text=[] if keep_text else None)
    sink = _CompletionSink(trace)
    try:
        async with asyncio.timeout(timeout_s):
            await client.request("POST", base_url + path, payload, sink, _JSON)
        sink.finish()
    except TimeoutError:
        trace.error = f"timeout after {timeout_s:g} s"
    except SSEOverflow as exc:
        trace.error = f"not an event stream: {exc}"
    except (ClientError, OSError) as exc:
        trace.error = f"{type(exc).__name__}: {str(exc)[:_ERROR_BODY_CHARS]}"
    if sink.reads:  # a stream cut short: what it had sent still counts (the request itself failed)
        with contextlib.suppress(SSEOverflow):
            sink.parse()
    trace.garbage += sink.parser.garbage
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
