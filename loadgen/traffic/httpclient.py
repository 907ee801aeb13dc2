"""A small HTTP/1.1 client for streamed responses, on asyncio's public protocol API.

Why our own: the sweep times each token event by the socket read that brought it, with the
kernel's receive time where it can (transport.py), which needs the socket under the protocol;
aiohttp's public API hands out neither. Here the response body goes to the request's sink inside
`data_received`, with the read's time, so every event keeps the time its bytes came off the
socket, and the request's coroutine wakes once, at the end.

Kept to what the load generator needs: one request at a time per connection, the body in memory,
responses framed by Content-Length, chunked or the connection's end; keep-alive connections
pooled per host; http (kernel read stamps) and https (the loop's TLS transport, reads stamped in
user space).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import string
import time
from typing import Protocol
from urllib.parse import urlsplit

from crossover.loadgen.traffic.transport import (
    KernelStampedTransport,
    keep_kernel_stamping_on,
    kernel_stamps_available,
)

MAX_HEAD_BYTES = 64 * 1024
_MAX_SIZE_LINE = 1024
_HEX = frozenset(string.hexdigits.encode())
_USER_AGENT = "vllm-crossover"


class ClientError(Exception):
    """A request that got no complete response: the message says why, in one line."""


class ConnectError(ClientError):
    """No connection could be made to the target."""


class ServerDisconnected(ClientError):
    """The server closed the connection before the response ended."""


class ProtocolError(ClientError):
    """The server's bytes are not an HTTP/1.1 response."""


class Sink(Protocol):
    """Where a response goes: its status and headers (names in lower case) once, then its body as
    it arrives, each piece with the time of the read that brought it. `feed` returns True when it
    wants no more (the rest of the body is dropped with the connection)."""

    def head(self, status: int, headers: dict[str, str]) -> None: ...

    def feed(self, data: bytes, stamp: float) -> bool | None: ...


class BufferSink:
    """A whole response in memory, up to `limit` body bytes."""

    def __init__(self, limit: int = 1 << 20) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.limit = limit

    def head(self, status: int, headers: dict[str, str]) -> None:
        self.status, self.headers = status, headers

    def feed(self, data: bytes, stamp: float) -> bool:
        self.body += data[:self.limit - len(self.body)]
        return len(self.body) >= self.limit


# How the body of the current response is framed, and where its parse stands.
_HEAD, _LENGTH, _UNTIL_CLOSE, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _DONE = range(8)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: writes a request, parses its response, feeds the sink."""

    def __init__(self, key: tuple[str, str, int]) -> None:
        self.key = key  # (scheme, host, port): the pool it returns to
        self.transport: asyncio.Transport | None = None
        self.read_stamp: float | None = None  # set by KernelStampedTransport before each read
        self.closed = False
        self.reusable = False
        self._sink: Sink | None = None
        self._done: asyncio.Future[None] | None = None
        self._state = _DONE
        self._partial = b""  # a head, size line or chunk end cut by a read
        self._left = 0  # body bytes (Content-Length) or chunk bytes still to come
        self.received = False  # any byte of the current response

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request: bytes, sink: Sink, done: asyncio.Future[None]) -> None:
        assert self.transport is not None and self._done is None
        self._sink, self._done = sink, done
        self._state, self._partial, self.received, self.reusable = _HEAD, b"", False, False
        self.transport.write(request)

    def data_received(self, data: bytes) -> None:
        stamp = self.read_stamp or time.time()
        sink = self._sink
        if sink is None:  # bytes nobody asked for: the connection is out of step
            self._close()
            return
        self.received = True
        try:
            if self._state == _CHUNK_SIZE and not self._partial and data[-2:] == b"\r\n":
                # the common read: one whole chunk (one token's event), handed on in one step
                line_end = data.find(b"\r\n", 0, 12)
                size = data[:line_end]
                if line_end > 0 and _HEX.issuperset(size) and line_end + 4 + int(size, 16) == len(data) \
                        and size.strip(b"0"):
                    if sink.feed(data[line_end + 2:-2], stamp):
                        self._wanted_no_more()
                    return
            if self._state == _HEAD:
                data = self._head(data)
                if not data:
                    return
            if self._state >= _CHUNK_SIZE:
                self._chunked(data, stamp)
            elif self._state == _LENGTH:
                self._length(data, stamp)
            elif self._state == _UNTIL_CLOSE:
                self._deliver(data, stamp)
            else:  # bytes after a complete response
                self._close()
        except Exception as exc:  # the sink's too: the request fails with it, the caller sees it
            self._fail(exc)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is None:
            return
        if self._state == _UNTIL_CLOSE:
            self._finish()
        elif self._state == _HEAD and not self.received:
            self._fail(ServerDisconnected("the server closed the connection without a response"))
        else:
            why = f": {exc}" if exc else ""
            self._fail(ServerDisconnected(f"the server closed the connection mid-response{why}"))

    def _head(self, data: bytes) -> bytes:
        """Parse the status line and headers; the body bytes after them are returned."""
        buffer = self._partial + data if self._partial else data
        end = buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(buffer) > MAX_HEAD_BYTES:
                raise ProtocolError(f"no end of the response head in {len(buffer)} bytes")
            self._partial = buffer
            return b""
        self._partial = b""
        lines = buffer[:end].decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:60]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon:
                raise ProtocolError(f"not a header line: {line[:60]!r}")
            name = name.strip().lower()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
        body = buffer[end + 4:]
        if 100 <= status < 200:  # an interim response: the real one follows
            return self._head(body) if body else b""
        tokens = {t.strip() for t in headers.get("connection", "").lower().split(",")}
        self.reusable = "close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens)
        coding = headers.get("transfer-encoding", "").lower()
        if coding:
            chunked = coding.rsplit(",", 1)[-1].strip() == "chunked"
            self._state = _CHUNK_SIZE if chunked else _UNTIL_CLOSE
        elif "content-length" in headers:
            length = headers["content-length"]
            if not length.isdigit():
                raise ProtocolError(f"bad Content-Length {length[:30]!r}")
            self._state, self._left = _LENGTH, int(length)
        elif status in (204, 304):
            self._state, self._left = _LENGTH, 0
        else:
            self._state = _UNTIL_CLOSE
        if self._state == _UNTIL_CLOSE:
            self.reusable = False
        assert self._sink is not None
        self._sink.head(status, headers)
        if self._state == _LENGTH and self._left == 0:
            self._finish()
            if body:
                self._close()
            return b""
        return body

    def _length(self, data: bytes, stamp: float) -> None:
        left = self._left
        if len(data) < left:
            self._left = left - len(data)
            self._deliver(data, stamp)
            return
        extra = len(data) > left
        if self._deliver(data[:left] if extra else data, stamp):
            return
        self._finish()
        if extra:
            self._close()

    def _chunked(self, data: bytes, stamp: float) -> None:
        """Decode chunked framing; the data of all chunks completed or cut by this read go to the
        sink at once (the common read, one whole chunk, is taken in data_received)."""
        if self._partial:
            data, self._partial = self._partial + data, b""
        pieces: list[bytes] = []
        position, end = 0, len(data)
        while position < end:
            state = self._state
            if state == _CHUNK_DATA:
                stop = position + self._left
                if stop > end:
                    pieces.append(data[position:])
                    self._left = stop - end
                    break
                pieces.append(data[position:stop])
                position, self._state = stop, _CHUNK_END
            elif state == _CHUNK_END:
                if end - position < 2:
                    self._partial = data[position:]
                    break
                if data[position:position + 2] != b"\r\n":
                    raise ProtocolError("a chunk not followed by CRLF")
                position, self._state = position + 2, _CHUNK_SIZE
            else:
                line_end = data.find(b"\r\n", position)
                if line_end < 0:
                    if end - position > _MAX_SIZE_LINE:
                        raise ProtocolError("a chunk size line over 1 KiB")
                    self._partial = data[position:]
                    break
                line = data[position:line_end]
                position = line_end + 2
                if state == _TRAILER:
                    if not line:
                        self._flush(pieces, stamp)
                        self._finish()
                        if position < end:
                            self._close()
                        return
                    continue
                size = line.split(b";", 1)[0].strip()
                if not size or not _HEX.issuperset(size):
                    raise ProtocolError(f"bad chunk size {bytes(size[:20])!r}")
                self._left = int(size, 16)
                self._state = _CHUNK_DATA if self._left else _TRAILER
        self._flush(pieces, stamp)

    def _flush(self, pieces: list[bytes], stamp: float) -> None:
        if pieces:
            self._deliver(pieces[0] if len(pieces) == 1 else b"".join(pieces), stamp)
            pieces.clear()

    def _deliver(self, data: bytes, stamp: float) -> bool:
        """Hand body bytes to the sink; True when it wanted no more (the exchange is over)."""
        assert self._sink is not None
        if self._sink.feed(data, stamp):
            self._wanted_no_more()
            return True
        return False

    def _wanted_no_more(self) -> None:
        """The sink ended the exchange before the response did: the rest goes with the connection."""
        self.reusable = False
        self._finish()
        self._close()

    def _finish(self) -> None:
        done, self._done, self._sink, self._state = self._done, None, None, _DONE
        if done is not None and not done.done():
            done.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        done, self._done, self._sink = self._done, None, None
        self.reusable = False
        self._close()
        if done is not None and not done.done():
            done.set_exception(exc)

    def _close(self) -> None:
        self.reusable = False
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()

    def abandon(self) -> None:
        """The request was given up (timeout, cancel): its connection goes with it."""
        self._done, self._sink = None, None
        self._close()


class HTTPClient:
    """Connections pooled per (scheme, host, port), no limit on their number (the sweep's levels
    set the concurrency). `kernel_stamps` stamps plain-TCP reads with the kernel's receive time
    where the platform has it; otherwise (and for https) with time.time() in data_received."""

    def __init__(self, *, kernel_stamps: bool = True, ssl_context: ssl.SSLContext | None = None) -> None:
        self.kernel_stamps = kernel_stamps and kernel_stamps_available()
        if self.kernel_stamps:  # on before the first connection, not a moment after (transport.py)
            keep_kernel_stamping_on()
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._live: set[_Connection] = set()
        self._addresses: dict[tuple[str, int], list[tuple[int, int, int, tuple]]] = {}
        self._targets: dict[str, tuple[tuple[str, str, int], str, str]] = {}

    async def __aenter__(self) -> HTTPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for connection in list(self._live):
            connection.abandon()
        self._live.clear()
        self._idle.clear()

    async def preconnect(self, url: str, count: int) -> None:
        """Open up to `count` connections to url's server and keep them idle for the requests to
        come: a request then starts on a warm connection (no name lookup on the executor's thread,
        no handshake) and its TTFT holds no time of the client's own that no server histogram sees.
        Connections that fail are left for the requests to open (and report)."""
        key = self._target(url)[0]
        have = len(self._idle.get(key, ()))
        opened = await asyncio.gather(*(self._connect(key) for _ in range(max(0, count - have))),
                                      return_exceptions=True)
        for connection in opened:
            if isinstance(connection, _Connection):
                self._live.add(connection)
                self._idle.setdefault(key, []).append(connection)

    async def request(self, method: str, url: str, body: bytes, sink: Sink,
                      headers: dict[str, str] | None = None) -> None:
        """Send one request and feed its response to `sink`; returns when the response ended.
        Raises ClientError (or OSError) when it could not be completed; cancelling it (a
        timeout) drops its connection."""
        key, target, host = self._target(url)
        head = [f"{method} {target} HTTP/1.1", f"Host: {host}", f"User-Agent: {_USER_AGENT}",
                f"Content-Length: {len(body)}"]
        head.extend(f"{name}: {value}" for name, value in (headers or {}).items())
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        connection, reused = await self._acquire(key)
        try:
            await self._exchange(connection, request, sink)
        except ServerDisconnected:
            # A kept-alive connection the server had already closed (its idle timeout): the
            # request never reached it, so it goes once more on a fresh connection.
            if not reused or connection.received:
                raise
            connection, _ = await self._acquire(key, fresh=True)
            await self._exchange(connection, request, sink)

    async def _exchange(self, connection: _Connection, request: bytes, sink: Sink) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.send(request, sink, done)
        try:
            await done
        except BaseException:
            connection.abandon()
            self._live.discard(connection)
            raise
        if connection.reusable and not connection.closed:
            self._idle.setdefault(connection.key, []).append(connection)
        else:
            connection.abandon()
            self._live.discard(connection)

    def _target(self, url: str) -> tuple[tuple[str, str, int], str, str]:
        """(pool key, request target, Host header) of a URL."""
        known = self._targets.get(url)
        if known is not None:
            return known
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"not an http(s) URL: {url!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as exc:
            raise ClientError(f"bad port in {url!r}") from exc
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        known = ((parts.scheme, parts.hostname, port), path, parts.netloc.rpartition("@")[2])
        self._targets[url] = known
        return known

    async def _acquire(self, key: tuple[str, str, int], fresh: bool = False) -> tuple[_Connection, bool]:
        idle = self._idle.get(key)
        while idle and not fresh:
            connection = idle.pop()
            if not connection.closed:
                return connection, True
            self._live.discard(connection)
        connection = await self._connect(key)
        self._live.add(connection)
        return connection, False

    async def _connect(self, key: tuple[str, str, int]) -> _Connection:
        _, host, port = key
        loop = asyncio.get_running_loop()
        try:
            infos = self._addresses.get((host, port))
            if infos is None:
                found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
                infos = self._addresses[(host, port)] = [(f, t, p, a) for f, t, p, _, a in found]
        except OSError as exc:
            raise ConnectError(f"cannot resolve {host}: {exc}") from exc
        failure: OSError | None = None
        for family, kind, proto, address in infos:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                await loop.sock_connect(sock, address)
                return await self._wrap(loop, sock, key)
            except OSError as exc:
                sock.close()
                failure = exc
            except BaseException:
                sock.close()
                raise
        raise ConnectError(f"cannot connect to {host}:{port}: {failure}")

    async def _wrap(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                    key: tuple[str, str, int]) -> _Connection:
        scheme, host, _ = key
        protocol = _Connection(key)
        if scheme == "http" and self.kernel_stamps:
            KernelStampedTransport(loop, sock, protocol)
        elif scheme == "http":
            await loop.create_connection(lambda: protocol, sock=sock)
        else:
            if self._ssl is None:  # loading the CA bundle takes milliseconds: once per client
                self._ssl = ssl.create_default_context()
            await loop.create_connection(lambda: protocol, sock=sock, ssl=self._ssl, server_hostname=host)
        return protocol
