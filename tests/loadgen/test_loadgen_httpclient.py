"""The load generator's HTTP/1.1 client (loadgen/traffic/httpclient.py): every framing a server may choose,
cut into socket reads anywhere, each body byte handed on with the time of the read that brought it;
keep-alive, interim responses, broken servers and TLS against scripted loopback servers."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crossover.loadgen.traffic.httpclient import (
    BufferSink,
    ClientError,
    ConnectError,
    HTTPClient,
    ProtocolError,
    ServerDisconnected,
    _Connection,
)
from crossover.loadgen.traffic.sse import SSEParser
from tests.helpers import require_binary

EVENTS = [b'data: {"choices": [{"text": "%d"}]}\n\n' % i for i in range(8)]


class EventSink:
    """Parses the body as SSE; each event takes the stamp it was fed with."""

    def __init__(self) -> None:
        self.status = 0
        self.parser = SSEParser()
        self.events: list[tuple[bytes, float]] = []

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status

    def feed(self, data: bytes, stamp: float) -> None:
        self.events.extend((event, stamp) for event in self.parser.feed(data))


class _NullTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.aborted = False

    def is_closing(self) -> bool:
        return self.aborted

    def write(self, data: bytes | bytearray | memoryview) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


def _chunked(body: bytes, sizes: list[int]) -> tuple[bytes, list[int]]:
    """`body` in chunks of the given sizes (cycled; some with extensions), a trailer at the end;
    also where each body byte sits on the wire."""
    wire, where, position, turn = bytearray(), list[int](), 0, 0
    while position < len(body):
        size = sizes[turn % len(sizes)]
        piece = body[position:position + size]
        wire += b"%x%s\r\n" % (len(piece), b";ext=1" if turn % 3 == 1 else b"")
        where.extend(range(len(wire), len(wire) + len(piece)))
        wire += piece + b"\r\n"
        position += size
        turn += 1
    wire += b"0\r\nX-Trailer: yes\r\n\r\n"
    return bytes(wire), where


def _expected_stamps(body: bytes, where: list[int], head: int, reads: list[bytes]) -> list[float]:
    """The stamp (1-based read number) of the read that brought each event's last byte."""
    ends, total = [], 0
    for number, read in enumerate(reads, 1):
        total += len(read)
        ends.append((total, float(number)))
    stamps, end = [], 0
    while (end := body.find(b"\n\n", end) + 2) > 1:
        last = head + where[end - 1]
        stamps.append(next(stamp for total, stamp in ends if total > last))
    return stamps


def _replay(reads: list[bytes], lose: bool = False) -> tuple[EventSink, asyncio.Future[None], _Connection]:
    async def go() -> tuple[EventSink, asyncio.Future[None], _Connection]:
        connection = _Connection(("http", "x", 80))
        connection.connection_made(_NullTransport())
        sink = EventSink()
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.send(b"GET / HTTP/1.1\r\n\r\n", sink, done)
        for number, read in enumerate(reads, 1):
            connection.read_stamp = float(number)
            connection.data_received(read)
        if lose:
            connection.connection_lost(None)
        return sink, done, connection

    return asyncio.run(go())


def _cut(wire: bytes, sizes: list[int]) -> list[bytes]:
    reads, position, turn = [], 0, 0
    while position < len(wire):
        reads.append(wire[position:position + sizes[turn % len(sizes)]])
        position += sizes[turn % len(sizes)]
        turn += 1
    return reads


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 90), min_size=1, max_size=10), st.lists(st.integers(1, 120), min_size=1,
                                                                        max_size=10))
def test_chunked_events_take_the_stamp_of_the_read_that_completed_them(chunks: list[int],
                                                                       reads: list[int]) -> None:
    body = b"".join(EVENTS)
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    wire, where = _chunked(body, chunks)
    cut = _cut(head + wire, reads)
    sink, done, connection = _replay(cut)
    assert [event for event, _ in sink.events] == [e[6:-2] for e in EVENTS]
    assert [stamp for _, stamp in sink.events] == _expected_stamps(body, where, len(head), cut)
    assert done.done() and done.exception() is None and connection.reusable


def test_a_read_of_one_whole_chunk_is_one_event_with_its_stamp() -> None:
    # the common read of a token stream, which data_received takes in one step
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunks = [b"%x\r\n%s\r\n" % (len(event), event) for event in EVENTS]
    sink, done, connection = _replay([head, *chunks, b"0\r\n\r\n"])
    assert sink.events == [(event[6:-2], float(number)) for number, event in enumerate(EVENTS, 2)]
    assert done.done() and done.exception() is None and connection.reusable


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 120), min_size=1, max_size=10), st.booleans())
def test_length_and_until_close_bodies_take_their_reads_stamps(reads: list[int], until_close: bool) -> None:
    body = b"".join(EVENTS)
    framing = b"Connection: close\r\n" if until_close else b"Content-Length: %d\r\n" % len(body)
    head = b"HTTP/1.1 200 OK\r\n" + framing + b"\r\n"
    cut = _cut(head + body, reads)
    sink, done, connection = _replay(cut, lose=until_close)
    expected = _expected_stamps(body, list(range(len(body))), len(head), cut)
    assert [stamp for _, stamp in sink.events] == expected
    assert done.done() and done.exception() is None
    assert connection.reusable is not until_close


@pytest.mark.parametrize(("wire", "error"), [
    (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
    (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "not a header line"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY", "not followed by CRLF"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000, "size line over 1 KiB"),
    (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000, "no end of the response head"),
])
def test_what_is_not_http_fails_the_request_with_why(wire: bytes, error: str) -> None:
    _, done, connection = _replay([wire])
    assert isinstance(done.exception(), ProtocolError) and error in str(done.exception())
    assert connection.closed and not connection.reusable


def test_a_connection_lost_mid_body_fails_the_request() -> None:
    _, done, _ = _replay([b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"], lose=True)
    assert isinstance(done.exception(), ServerDisconnected)
    assert "mid-response" in str(done.exception())


@dataclass
class Reply:
    pieces: list[bytes]
    close: bool = False  # close the connection after the reply


@dataclass
class ScriptedServer:
    """A loopback server that answers each request with the next scripted reply, piece by piece."""

    replies: list[Reply]
    tls: ssl.SSLContext | None = None
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    def __enter__(self) -> ScriptedServer:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self._listener.getsockname()[1]}"
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(5)

    def _serve(self) -> None:
        while self.replies:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            with conn, contextlib.suppress(OSError):  # a client that hung up early
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        buffer = b""
        while self.replies:
            while b"\r\n\r\n" not in buffer:
                data = conn.recv(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = int(next((line.split(b":")[1] for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), b"0"))
            while len(buffer) < length:
                buffer += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + buffer[:length])
            buffer = buffer[length:]
            reply = self.replies.pop(0)
            for piece in reply.pieces:
                conn.sendall(piece)
            if reply.close:
                return


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def _fetch(url: str, count: int = 1, **options: object) -> list[BufferSink]:
    async def go() -> list[BufferSink]:
        sinks = []
        async with HTTPClient(**options) as client:  # type: ignore[arg-type]
            for _ in range(count):
                sink = BufferSink()
                await client.request("POST", url + "/v1/x?y=1", b'{"a": 1}', sink,
                                     {"Content-Type": "application/json"})
                sinks.append(sink)
        return sinks

    return asyncio.run(go())


def test_requests_are_well_formed_and_share_a_kept_alive_connection() -> None:
    with ScriptedServer([Reply([OK]), Reply([OK])]) as server:
        sinks = _fetch(server.url, 2)
    assert [(s.status, bytes(s.body)) for s in sinks] == [(200, b"ok")] * 2
    assert server.connections == 1
    port = server.url.rsplit(":", 1)[1]
    assert server.requests[0] == (b"POST /v1/x?y=1 HTTP/1.1\r\nHost: 127.0.0.1:%s\r\n"
                                  b"User-Agent: vllm-crossover\r\nContent-Length: 8\r\n"
                                  b"Content-Type: application/json\r\n\r\n"
                                  b'{"a": 1}' % port.encode())


@pytest.mark.parametrize("reply", [
    Reply([b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"]),
    Reply([b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"]),
    Reply([OK + b"surplus"]),  # bytes after the response: the connection is out of step
])
def test_a_connection_that_cannot_be_kept_is_not_reused(reply: Reply) -> None:
    with ScriptedServer([reply, Reply([OK])]) as server:
        sinks = _fetch(server.url, 2)
    assert [bytes(s.body) for s in sinks] == [b"ok", b"ok"] and server.connections == 2


def test_a_kept_alive_connection_the_server_closed_is_retried_on_a_fresh_one() -> None:
    with ScriptedServer([Reply([OK], close=True), Reply([OK])]) as server:
        sinks = _fetch(server.url, 2)
    assert [bytes(s.body) for s in sinks] == [b"ok", b"ok"] and server.connections == 2


def test_an_interim_response_is_skipped_and_headers_are_read() -> None:
    reply = Reply([b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 201 Created\r\nX-A: 1\r\nx-a: 2\r\n",
                   b"Content-Length: 0\r\n\r\n"])
    with ScriptedServer([reply]) as server:
        (sink,) = _fetch(server.url)
    assert sink.status == 201 and sink.headers["x-a"] == "1, 2" and sink.body == b""


def test_a_sink_that_wants_no_more_ends_the_request_at_once() -> None:
    endless = Reply([b"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\n\r\n"] + [b"400\r\n" + b"x" * 1024
                                                                                     + b"\r\n"] * 64)
    with ScriptedServer([endless, Reply([OK])]) as server:
        async def go() -> tuple[BufferSink, BufferSink]:
            async with HTTPClient() as client:
                first, second = BufferSink(limit=100), BufferSink()
                await client.request("GET", server.url, b"", first)
                await client.request("GET", server.url, b"", second)
                return first, second

        first, second = asyncio.run(go())
    assert first.status == 500 and first.body == b"x" * 100
    assert second.body == b"ok" and server.connections == 2


def test_a_server_that_closes_without_answering_a_fresh_connection_fails() -> None:
    with ScriptedServer([Reply([], close=True)]) as server, pytest.raises(ServerDisconnected):
        _fetch(server.url)


def test_nothing_listening_and_bad_urls_are_client_errors() -> None:
    from crossover.netutil import free_port

    with pytest.raises(ConnectError, match=r"cannot connect to 127\.0\.0\.1:"):
        _fetch(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectError, match="cannot resolve"):
        _fetch("http://no-such-host.invalid")
    for url in ("ftp://127.0.0.1", "http://127.0.0.1:99999"):
        with pytest.raises(ClientError):
            _fetch(url)


def test_https_works_with_reads_stamped_in_user_space(tmp_path: Path) -> None:
    openssl = require_binary("openssl")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    server_side = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_side.load_cert_chain(cert, key)
    client_side = ssl.create_default_context(cafile=str(cert))
    with ScriptedServer([Reply([OK]), Reply([OK])], tls=server_side) as server:
        sinks = _fetch(server.url, 2, ssl_context=client_side)
    assert [bytes(s.body) for s in sinks] == [b"ok", b"ok"] and server.connections == 1


def test_preconnected_connections_carry_the_first_requests_and_a_refused_one_is_left_to_them() -> None:
    async def go(url: str, closed_url: str) -> tuple[int, int, BufferSink]:
        async with HTTPClient() as client:
            await client.preconnect(url, 1)
            await client.preconnect(url, 1)  # already there: nothing more opened
            await client.preconnect(closed_url, 2)  # nothing listening: no error here
            opened = len(client._live)
            sink = BufferSink()
            await client.request("POST", url + "/v1/x", b"{}", sink)
            return opened, len(client._live), sink

    with socket.create_server(("127.0.0.1", 0)) as closed:
        closed_url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with ScriptedServer([Reply([OK])]) as server:
        opened, live, sink = asyncio.run(go(server.url, closed_url))
    assert (opened, live, server.connections) == (1, 1, 1)
    assert (sink.status, bytes(sink.body)) == (200, b"ok")
