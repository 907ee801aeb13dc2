"""One streamed request against a real loopback server that misbehaves in every way we know."""

from __future__ import annotations

import asyncio
import itertools
import math
import statistics
import time

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover.loadgen.client import (
    Balancer,
    RequestRecord,
    StreamTrace,
    build_record,
    expand_itl,
    stream_completion,
)
from crossover.loadgen.dataset import SyntheticRequest
from crossover.loadgen.payloads import request_payload as completion_payload
from crossover.spec import Balance
from tests.loadgen.loadgen_fake_server import Behaviour, FakeServer

REQUEST = SyntheticRequest(index=3, prompt="w1 w2 w3 w4", input_len=4, output_len=9)


@pytest.fixture(params=["plain", "stamping", "stamping-userspace"])
def connector(request: pytest.FixtureRequest) -> str:
    """How _send connects: aiohttp's own connector (the coroutine reads the body), or the sweep's
    (the protocol parses the body as it arrives), with kernel or user-space read stamps."""
    return str(request.param)


def _send(server: FakeServer, timeout_s: float = 10.0, connector: str = "plain") -> RequestRecord:
    from crossover.loadgen.client import stamping_connector

    async def go() -> StreamTrace:
        made = None if connector == "plain" else stamping_connector(kernel_stamps=connector == "stamping")
        async with aiohttp.ClientSession(connector=made) as session:
            payload = completion_payload("m", REQUEST, True)
            return await stream_completion(session, server.url, payload, timeout_s)

    trace = asyncio.run(go())
    return build_record(trace, REQUEST, "t", 1.0, server.url)


def test_well_behaved_stream_times_match_the_server(connector: str) -> None:
    with FakeServer(Behaviour(ttft_s=0.05, tpot_s=0.01)) as server:
        record = _send(server, connector=connector)
    assert record.ok, record.error
    assert record.output_tokens == 9 and record.input_tokens == 4
    assert record.completion_id == "cmpl-1"
    assert len(record.itl) == 8
    assert math.isclose(sum(record.itl), record.e2e - record.ttft, rel_tol=1e-9)
    assert math.isclose(record.tpot, (record.e2e - record.ttft) / 8)
    truth = server.recorded[0]
    # the client sees each event after the server began writing it and not much after the write
    # returned (the server shares this process, so its stamps can trail a GIL hand-over)
    assert record.ttft >= 0.05
    for client, started, written in zip(record.chunk_times, truth.write_starts, truth.token_times,
                                        strict=True):
        seen = record.send_time + client
        assert started - 0.001 < seen < written + 0.05, (seen - started, seen - written)
    assert server.bodies[0]["ignore_eos"] is True and server.bodies[0]["min_tokens"] == 9
    assert server.bodies[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_several_tokens_per_event_give_one_itl_per_token(connector: str) -> None:
    with FakeServer(Behaviour(tokens_per_event=4, tpot_s=0.01)) as server:
        record = _send(server, connector=connector)
    assert record.ok, record.error
    assert record.chunk_tokens == [4, 4, 1]
    assert record.output_tokens == 9
    assert len(record.itl) == 8  # vllm bench serve would report 2
    assert record.itl[:3] == [0.0, 0.0, 0.0]  # came with the first token
    assert math.isclose(sum(record.itl), record.e2e - record.ttft, rel_tol=1e-9)


def test_without_continuous_usage_the_final_usage_sets_the_count(connector: str) -> None:
    with FakeServer(Behaviour(tokens_per_event=3, continuous_usage=False)) as server:
        record = _send(server, connector=connector)
    assert record.ok, record.error
    assert record.output_tokens == 9
    assert sum(record.chunk_tokens) == 9
    assert len(record.itl) == 8


def test_garbage_between_events_is_survived_and_counted(connector: str) -> None:
    with FakeServer(Behaviour(garbage=True, crlf=True)) as server:
        record = _send(server, connector=connector)
    assert record.ok, record.error
    assert record.output_tokens == 9
    assert record.garbage >= 9 * 2  # junk line and broken JSON at least, per token


@pytest.mark.parametrize(("behaviour", "error"), [
    (Behaviour(status=503), "HTTP 503"),
    (Behaviour(drop_after=3), ""),
    (Behaviour(no_done=True), "stream ended before [DONE]"),
    (Behaviour(error_event=True), "error event: engine died"),
])
def test_failures_are_failed_requests_with_a_reason(behaviour: Behaviour, error: str, connector: str) -> None:
    with FakeServer(behaviour) as server:
        record = _send(server, connector=connector)
    assert not record.ok
    assert record.error and error in record.error
    assert record.output_tokens == 0 and math.isnan(record.ttft)


def test_a_hanging_server_times_out_and_the_client_returns(connector: str) -> None:
    with FakeServer(Behaviour(hang=True)) as server:
        started = time.monotonic()
        record = _send(server, timeout_s=0.5, connector=connector)
        elapsed = time.monotonic() - started
    assert not record.ok and record.error == "timeout after 0.5 s"
    assert elapsed < 5


def test_nothing_listening_is_a_failed_request() -> None:
    from crossover.netutil import free_port

    async def go() -> StreamTrace:
        async with aiohttp.ClientSession() as session:
            return await stream_completion(session, f"http://127.0.0.1:{free_port()}",
                                           completion_payload("m", REQUEST, True), 2.0)

    record = build_record(asyncio.run(go()), REQUEST, "t", 1.0, "x")
    assert not record.ok and "Connect" in record.error


def test_a_usage_count_above_max_tokens_is_a_failed_request() -> None:
    trace = StreamTrace(send_time=0.0, chunk_times=[0.1, 0.2], chunk_tokens=[1, 999_999],
                        usage_completion_tokens=1_000_000, status=200, done=True)
    record = build_record(trace, REQUEST, "t", 1.0, "u")
    assert not record.ok and record.output_tokens == 0
    assert record.error == "protocol violation: 1000000 output tokens reported, max_tokens was 9"


def test_expand_itl() -> None:
    assert expand_itl([0.1, 0.3, 0.4], [1, 2, 1]) == pytest.approx([0.1, 0.1, 0.1])
    assert expand_itl([0.1], [3]) == [0.0, 0.0]
    assert expand_itl([], []) == []


def test_round_robin_and_least_outstanding() -> None:
    rr = Balancer(["a", "b"], Balance.ROUND_ROBIN)
    assert [rr.acquire() for _ in range(4)] == ["a", "b", "a", "b"]
    lo = Balancer(["a", "b"], Balance.LEAST_OUTSTANDING)
    first = lo.acquire()
    second = lo.acquire()
    assert {first, second} == {"a", "b"}
    lo.release("a")  # b still busy: the next one must go to a, twice in a row if a frees again
    assert lo.acquire() == "a"
    lo.release("a")
    assert lo.acquire() == "a"


def test_events_take_the_time_of_the_socket_read_that_completed_them() -> None:
    from crossover.loadgen.client import _feed_stamped
    from crossover.loadgen.sse import SSEParser

    events = [b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "b"}]}\n\n',
              b'data: {"choices": [{"text": "c"}]}\n\n']
    body = b"".join(events)
    first_read = len(events[0]) + 5  # the first read ended inside the second event
    trace = StreamTrace(send_time=0.0)
    # the coroutine saw everything at t=9; the reads arrived at t=1 (first_read bytes) and t=2
    _feed_stamped(SSEParser(), trace, body, 0, [(first_read, 1.0), (len(body), 2.0)], fallback=9.0)
    assert trace.chunk_times == [1.0, 2.0, 2.0]


def test_sweep_connections_stamp_their_reads() -> None:
    from crossover.loadgen.client import StampingResponseHandler, stamping_connector

    async def go(url: str) -> tuple[bool, int]:
        connector = stamping_connector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            payload = completion_payload("m", REQUEST, True)
            async with session.post(url + "/v1/completions", data=payload) as response:
                protocol = response.connection.protocol if response.connection else None
                await response.read()
                if not isinstance(protocol, StampingResponseHandler):
                    return False, 0
                return True, len(protocol.stamps)

    with FakeServer() as server:
        stamped, reads = asyncio.run(go(server.url))
    assert stamped and reads >= 2  # headers and the events came in several reads


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=120), min_size=1, max_size=12),
       st.lists(st.integers(min_value=1, max_value=200), min_size=1, max_size=12))
def test_any_reads_and_chunks_give_each_event_its_completing_read(read_sizes: list[int],
                                                                  chunk_sizes: list[int]) -> None:
    """Socket reads of random sizes (stamped 1, 2, 3...) and coroutine chunks of other random
    sizes: every event must take the stamp of the read that delivered its last byte."""
    from crossover.loadgen.client import StampingResponseHandler, _feed_stamped, _read_stamps
    from crossover.loadgen.sse import SSEParser

    body = b"".join(b'data: {"choices": [{"text": "%d"}]}\n\n' % i for i in range(8))
    reads, offset = [], 0
    for n, size in enumerate(itertools.cycle(read_sizes), 1):
        if offset >= len(body):
            break
        offset = min(len(body), offset + size)
        reads.append((offset, float(n)))
    expected = []
    end = 0
    for _ in range(8):
        end = body.index(b"\n\n", end) + 2
        expected.append(next(t for o, t in reads if o >= end))

    class Fake:
        content = object()

    protocol = StampingResponseHandler.__new__(StampingResponseHandler)
    protocol.stamped_body = Fake.content
    trace = StreamTrace(send_time=0.0)
    parser = SSEParser()
    consumed, delivered = 0, 0
    sizes = itertools.cycle(chunk_sizes)
    while consumed < len(body):
        # the coroutine reads only what the socket has delivered so far
        arrived = reads[delivered][0]
        protocol.stamps = [r for r in reads[: delivered + 1]]
        chunk = body[consumed:min(arrived, consumed + next(sizes))]
        stamps = _read_stamps(protocol, Fake.content, consumed, consumed + len(chunk))
        _feed_stamped(parser, trace, chunk, consumed, stamps, fallback=-1.0)
        consumed += len(chunk)
        if consumed >= arrived and delivered + 1 < len(reads):
            delivered += 1
    assert trace.chunk_times == expected


def test_streams_use_the_read_stamps_also_on_a_reused_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    import crossover.loadgen.client as client

    unstamped: list[tuple[int, int]] = []
    original = client._read_stamps

    def spy(protocol: object, body: object, start: int, end: int) -> list[tuple[int, float]]:
        stamps = original(protocol, body, start, end)
        if end > start and not stamps:
            unstamped.append((start, end))
        return stamps

    monkeypatch.setattr(client, "_read_stamps", spy)

    async def go(url: str) -> list[StreamTrace]:
        async with aiohttp.ClientSession(connector=client.stamping_connector(limit=1)) as session:
            payload = completion_payload("m", REQUEST, True)
            return [await stream_completion(session, url, payload, 10.0) for _ in range(2)]

    with FakeServer(Behaviour(tpot_s=0.005)) as server:
        traces = asyncio.run(go(server.url))
    assert all(t.done and not t.error for t in traces), [(t.done, t.error) for t in traces]
    assert unstamped == []  # every body byte of both streams was matched to the read that brought it


def test_a_stamping_connection_parses_in_the_protocol_with_kernel_read_times(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep's connections: the events are parsed and stamped in data_received, each with the
    kernel's receive time of its read (which precedes the coroutine's clock, never follows it)."""
    import crossover.loadgen.client as client
    from crossover.loadgen.transport import KernelStampedTransport, keep_kernel_stamping_on

    keep_kernel_stamping_on()  # Linux turns stamping on a moment after the first socket asks
    time.sleep(0.1)

    async def never(*args: object) -> None:
        raise AssertionError("the stream's coroutine read the body")

    monkeypatch.setattr(client, "_read_in_coroutine", never)
    stamps: list[float | None] = []
    original = client.StampingResponseHandler.data_received

    def spy(self: client.StampingResponseHandler, data: bytes) -> None:
        assert isinstance(self.transport, KernelStampedTransport)
        stamps.append(self.read_stamp)
        original(self, data)

    monkeypatch.setattr(client.StampingResponseHandler, "data_received", spy)
    with FakeServer(Behaviour(ttft_s=0.02, tpot_s=0.005)) as server:
        record = _send(server, connector="stamping")
    assert record.ok, record.error
    assert stamps and all(s is not None for s in stamps)
    truth = server.recorded[0]
    errors = [record.send_time + stamp - written
              for stamp, written in zip(record.chunk_times, truth.token_times, strict=True)]
    # The kernel took the time during the server's write, which stamps after it returns: a hair
    # early, never late, unless the client fell a whole token behind (this test shares its
    # process and GIL with the server, and CI loads the machine): then one read carries two
    # events and both get its time, so an event is stamped no later than the next one's write.
    assert all(error > -0.05 for error in errors), errors
    assert statistics.median(errors) < 0.002, errors
    for k, error in enumerate(errors[:-1]):
        assert truth.token_times[k] + error < truth.token_times[k + 1] + 0.002, (k, errors)


class _NullTransport(asyncio.Transport):
    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=150), min_size=1, max_size=12),
       st.integers(min_value=0, max_value=40))
def test_events_parsed_in_the_protocol_take_their_completing_read(read_sizes: list[int],
                                                                  attach_after: int) -> None:
    """A chunked response cut into socket reads of random sizes (stamped 1, 2, 3...), the stream's
    sink attached after a random number of them (the coroutine got the response late): every
    event must take the stamp of the read that delivered its last byte, whether it was parsed
    from the protocol's notes (before the sink) or by the sink."""
    from crossover.loadgen.client import StampingResponseHandler, _attach_sink
    from crossover.loadgen.sse import SSEParser

    events = [b'data: {"choices": [{"text": "%d"}]}\n\n' % i for i in range(8)]
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire, ends = bytearray(head), []
    for event in events:
        wire += b"%x\r\n" % len(event)
        wire += event
        ends.append(len(wire))  # the event's last byte is wire[end - 1]
        wire += b"\r\n"
    wire += b"0\r\n\r\n"
    reads, offset = [], 0
    for size in itertools.cycle(read_sizes):
        if offset >= len(wire):
            break
        reads.append(bytes(wire[offset:offset + size]))
        offset += size
    expected = []
    for end in ends:
        total = 0
        for n, read in enumerate(reads, 1):
            total += len(read)
            if total >= end:
                expected.append(float(n))
                break

    async def go() -> StreamTrace:
        protocol = StampingResponseHandler(asyncio.get_running_loop())
        protocol.connection_made(_NullTransport())
        protocol.set_response_params(read_until_eof=False, auto_decompress=False)
        trace = StreamTrace(send_time=0.0)
        parser = SSEParser()
        attached = False
        for n, read in enumerate(reads, 1):
            protocol.read_stamp = float(n)
            protocol.data_received(read)
            if n >= attach_after and not attached and protocol.stamped_body is not None:
                attached = True
                if _attach_sink(protocol, protocol.stamped_body, parser, trace) is None:
                    break
        if not attached:
            _attach_sink(protocol, protocol.stamped_body, parser, trace)
        return trace

    trace = asyncio.run(go())
    assert trace.chunk_times == expected
