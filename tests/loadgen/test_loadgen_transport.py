"""KernelStampedTransport on its own, on asyncio's loop and on uvloop: reads carry the kernel's
receive time, large writes are buffered until the peer takes them, and the end of a connection
(peer's close, our close, abort, reset) reaches the protocol exactly once."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from crossover.loadgen.traffic.transport import KernelStampedTransport, kernel_stamps_available

T = TypeVar("T")
pytestmark = pytest.mark.skipif(not kernel_stamps_available(), reason="no SO_TIMESTAMPNS here")


class Recorder(asyncio.Protocol):
    def __init__(self) -> None:
        self.read_stamp: float | None = None
        self.reads: list[tuple[bytes, float | None]] = []
        self.eof = 0
        self.lost: list[BaseException | None] = []
        self.made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made += 1

    def data_received(self, data: bytes) -> None:
        self.reads.append((data, self.read_stamp))

    def eof_received(self) -> bool | None:
        self.eof += 1
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.append(exc)


def _loops() -> list[Callable[[], asyncio.AbstractEventLoop]]:
    factories: list[Callable[[], asyncio.AbstractEventLoop]] = [asyncio.new_event_loop]
    try:
        import uvloop
    except ImportError:
        return factories
    return [*factories, uvloop.new_event_loop]


class Run:
    def __init__(self, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        self.factory = factory

    def __call__(self, coroutine: Coroutine[Any, Any, T]) -> T:
        with asyncio.Runner(loop_factory=self.factory) as runner:
            return runner.run(coroutine)


@pytest.fixture(params=_loops(), ids=lambda f: f.__module__.split(".")[0])
def run(request: pytest.FixtureRequest) -> Run:
    return Run(request.param)


async def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return client, server


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.005)


def test_reads_carry_the_kernel_receive_time_and_the_peer_close_ends_once(run: Run) -> None:
    async def go() -> Recorder:
        client, server = await _pair()
        protocol = Recorder()
        KernelStampedTransport(asyncio.get_running_loop(), client, protocol)
        # Linux turns receive stamping on from a work queue a moment after the first socket asks
        # (the transport keeps a holder socket from then on): wait for the first stamped read.
        deadline = time.monotonic() + 5
        while not protocol.reads or protocol.reads[-1][1] is None:
            assert time.monotonic() < deadline, "the kernel never stamped a read"
            server.send(b"warm-up\n")
            await _until(lambda: bool(protocol.reads) and protocol.reads[-1][0].endswith(b"warm-up\n"))
            if protocol.reads[-1][1] is None:
                await asyncio.sleep(0.01)
        protocol.reads.clear()
        written: list[tuple[float, float]] = []
        for n in range(3):
            before = time.time()
            server.send(b"event %d\n" % n)
            written.append((before, time.time()))
            await _until(lambda: len(protocol.reads) == len(written))
        server.close()
        await _until(lambda: bool(protocol.lost))
        await asyncio.sleep(0.05)
        for (_, stamp), (before, after) in zip(protocol.reads, written, strict=True):
            assert stamp is not None and before <= stamp <= after  # taken during the send
        return protocol

    protocol = run(go())
    assert b"".join(d for d, _ in protocol.reads) == b"event 0\nevent 1\nevent 2\n"
    assert protocol.made == 1 and protocol.eof == 1 and protocol.lost == [None]


def test_a_large_write_is_buffered_until_the_peer_reads_and_close_flushes_it(run: Run) -> None:
    payload = bytes(range(256)) * (16 * 1024)  # 4 MiB, far more than the socket buffers

    async def go() -> tuple[bytes, Recorder]:
        client, server = await _pair()
        protocol = Recorder()
        transport = KernelStampedTransport(asyncio.get_running_loop(), client, protocol)
        transport.write(payload)
        assert transport.get_write_buffer_size() > 0
        transport.close()
        assert transport.is_closing() and not protocol.lost  # not before the buffer is sent
        server.setblocking(False)
        received = bytearray()
        while True:
            try:
                chunk = server.recv(1 << 20)
            except BlockingIOError:
                await asyncio.sleep(0.001)
                continue
            if not chunk:
                break
            received += chunk
        server.close()
        await _until(lambda: bool(protocol.lost))
        return bytes(received), protocol

    received, protocol = run(go())
    assert received == payload
    assert protocol.lost == [None]


def test_abort_and_a_reset_reach_the_protocol_once(run: Run) -> None:
    async def go() -> tuple[Recorder, Recorder]:
        loop = asyncio.get_running_loop()
        client, server = await _pair()
        aborted = Recorder()
        transport = KernelStampedTransport(loop, client, aborted)
        transport.abort()
        transport.abort()
        transport.close()
        await _until(lambda: bool(aborted.lost))
        server.close()

        client, server = await _pair()
        reset = Recorder()
        KernelStampedTransport(loop, client, reset)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server.close()  # linger 0: an RST
        await _until(lambda: bool(reset.lost))
        await asyncio.sleep(0.05)
        return aborted, reset

    aborted, reset = run(go())
    assert aborted.lost == [None]
    assert len(reset.lost) == 1 and isinstance(reset.lost[0], ConnectionResetError)
