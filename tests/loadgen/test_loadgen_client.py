"""One streamed request against a real loopback server that misbehaves in every way we know."""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable

import pytest

from crossover.loadgen.traffic.client import (
    Balancer,
    RequestRecord,
    StreamTrace,
    build_record,
    expand_itl,
    stream_completion,
)
from crossover.loadgen.traffic.dataset import SyntheticRequest
from crossover.loadgen.traffic.httpclient import HTTPClient
from crossover.loadgen.traffic.payloads import request_payload as completion_payload
from crossover.spec import Balance
from tests.loadgen.loadgen_fake_server import Behaviour, FakeServer

REQUEST = SyntheticRequest(index=3, prompt="w1 w2 w3 w4", input_len=4, output_len=9)


def _loop(kind: str) -> Callable[[], asyncio.AbstractEventLoop]:
    from crossover.eventloop import loop_factory

    return loop_factory(kind)


@pytest.fixture(params=["kernel-uvloop", "kernel-asyncio", "userspace-asyncio"])
def connector(request: pytest.FixtureRequest) -> str:
    """How _send connects: reads stamped by the kernel (the sweep's way) or in user space, on
    uvloop (the sweep's) or asyncio's loop."""
    return str(request.param)


def _send(server: FakeServer, timeout_s: float = 10.0, connector: str = "kernel-uvloop") -> RequestRecord:
    stamps, loop = connector.split("-")

    async def go() -> StreamTrace:
        async with HTTPClient(kernel_stamps=stamps == "kernel") as client:
            payload = completion_payload("m", REQUEST, True)
            return await stream_completion(client, server.url, payload, timeout_s)

    with asyncio.Runner(loop_factory=_loop(loop)) as runner:
        trace = runner.run(go())
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


def test_a_stream_cut_short_keeps_the_events_it_sent(connector: str) -> None:
    # the reads are parsed after the response (in batches): a failed one is parsed too
    with FakeServer(Behaviour(drop_after=3)) as server:
        record = _send(server, connector=connector)
    assert not record.ok and len(record.chunk_times) == 3 and record.chunk_tokens == [1, 1, 1]


def test_a_long_stream_is_parsed_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import crossover.loadgen.traffic.client as client_module

    kept: list[int] = []
    parse = client_module._CompletionSink.parse

    def counting(sink: client_module._CompletionSink) -> None:
        kept.append(len(sink.reads))
        parse(sink)

    monkeypatch.setattr(client_module, "PARSE_BATCH", 4)
    monkeypatch.setattr(client_module._CompletionSink, "parse", counting)
    with FakeServer(Behaviour(tpot_s=0.005)) as server:
        record = _send(server)
    assert record.ok and record.output_tokens == 9 and len(record.itl) == 8
    assert max(kept) == 4 and len(kept) >= 3  # 9 token events and the end: batches of 4 and the rest


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
        async with HTTPClient() as client:
            return await stream_completion(client, f"http://127.0.0.1:{free_port()}",
                                           completion_payload("m", REQUEST, True), 2.0)

    record = build_record(asyncio.run(go()), REQUEST, "t", 1.0, "x")
    assert not record.ok and record.error.startswith("ConnectError: cannot connect to 127.0.0.1:")


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


def test_a_kept_alive_connection_serves_the_next_stream_with_kernel_stamps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams one after the other share one connection, and every read of both carries the
    kernel's receive time."""
    from crossover.loadgen.traffic import httpclient
    from crossover.loadgen.traffic.transport import KernelStampedTransport

    connections: set[int] = set()
    stamps: list[float | None] = []
    original = httpclient._Connection.data_received

    def spy(self: httpclient._Connection, data: bytes) -> None:
        assert isinstance(self.transport, KernelStampedTransport)
        connections.add(id(self))
        stamps.append(self.read_stamp)
        original(self, data)

    monkeypatch.setattr(httpclient._Connection, "data_received", spy)

    async def go(url: str) -> list[StreamTrace]:
        async with HTTPClient() as client:
            payload = completion_payload("m", REQUEST, True)
            return [await stream_completion(client, url, payload, 10.0) for _ in range(2)]

    _hold_kernel_stamping()
    with FakeServer(Behaviour(tpot_s=0.005)) as server:
        traces = asyncio.run(go(server.url))
    assert all(t.done and not t.error for t in traces), [(t.done, t.error) for t in traces]
    # a loaded machine may hand two events in one read (they share its stamp): count events, not reads
    assert all(len(t.chunk_times) == REQUEST.output_len for t in traces), [t.chunk_times for t in traces]
    assert len(connections) == 1 and len(stamps) >= len(traces)
    assert all(s is not None for s in stamps)


def _hold_kernel_stamping() -> None:
    from crossover.loadgen.traffic.transport import keep_kernel_stamping_on

    keep_kernel_stamping_on()  # Linux turns stamping on a moment after the first socket asks
    time.sleep(0.1)


def test_events_carry_the_kernel_read_times_of_the_servers_writes() -> None:
    """The sweep's connections: each event takes the kernel's receive time of its read, which
    precedes the coroutine's clock, never follows it."""
    _hold_kernel_stamping()
    with FakeServer(Behaviour(ttft_s=0.02, tpot_s=0.005)) as server:
        record = _send(server, connector="kernel-uvloop")
    assert record.ok, record.error
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


def test_events_that_wait_for_a_busy_client_share_a_read_and_are_counted() -> None:
    """A client that falls behind (its loop busy while the server writes) reads the waiting events
    at once: they carry that read's one stamp, the last arrival's, and the record counts them."""
    _hold_kernel_stamping()
    request = SyntheticRequest(index=0, prompt="w1 w2 w3 w4", input_len=4, output_len=24)

    async def go() -> StreamTrace:
        # busy (not awaiting) from after the first tokens until after the last was written
        asyncio.get_running_loop().call_later(0.04, time.sleep, 0.15)
        async with HTTPClient() as client:
            return await stream_completion(client, server.url, completion_payload("m", request, True), 10.0)

    with FakeServer(Behaviour(ttft_s=0.02, tpot_s=0.004)) as server, \
            asyncio.Runner(loop_factory=_loop("uvloop")) as runner:
        record = build_record(runner.run(go()), request, "t", 1.0, server.url)
    assert record.ok, record.error
    stamps = record.chunk_times
    shared = sum(1 for k, stamp in enumerate(stamps)
                 if stamp in (stamps[k - 1] if k else None, stamps[k + 1] if k + 1 < len(stamps) else None))
    assert record.shared_reads >= 10 and record.shared_reads == shared, (record.shared_reads, stamps)
    # the shared stamp is the last arrival's: the earlier events of that read are stamped late
    truth = server.recorded[0]
    late = [record.send_time + stamp - written for stamp, written in zip(stamps, truth.token_times,
                                                                          strict=True)]
    assert max(late) > 0.03, late
