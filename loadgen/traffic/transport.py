"""A TCP transport that stamps every socket read with the kernel's receive time.

Why: one client core serves hundreds of streams whose tokens arrive together (one engine step
writes a chunk to every stream). Python handles the reads one after another, tens of
microseconds each, so a time taken in user space is late by the reads handled before it: about
10 ms for the last of 512 reads. With SO_TIMESTAMPNS the kernel notes when each packet arrived
(on loopback: during the server's write), and recvmsg hands the time to us with the bytes, so the
stamp does not depend on how busy the client is.

The transport reads with `recvmsg` from `loop.add_reader`, so it works on asyncio's loop and on
uvloop alike, and hands each read to the protocol with `protocol.read_stamp` set just before
`data_received` (None when the kernel gave no time). Writes are the usual non-blocking send with a
buffer. Only plain TCP (no TLS): the connector keeps the loop's transport for anything else.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from typing import Any

# SO_TIMESTAMPNS (the old, 64-bit timespec on 64-bit Linux: SO_TIMESTAMPNS_OLD) is 35 on every
# Linux architecture Python runs on except a few (parisc, sparc), which are not supported here.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@qq") if struct.calcsize("@l") == 8 else None
STAMP_SPACE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0  # recvmsg's ancillary size


def kernel_stamp(ancdata: list[tuple[int, int, bytes]]) -> float | None:
    """The kernel's receive time (unix seconds) in a recvmsg's ancillary data, None without one."""
    stamp = None
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and _TIMESPEC is not None:
            seconds, nanoseconds = _TIMESPEC.unpack_from(payload)
            stamp = seconds + nanoseconds * 1e-9
    return stamp


_HOLDER: socket.socket | None = None


def keep_kernel_stamping_on() -> None:
    """Hold one socket with SO_TIMESTAMPNS for the life of the process. Linux stamps received
    packets only while some socket asks for it, and it turns stamping on from a work queue a moment
    after the first such socket appears (and off after the last one closes): without a holder, the
    first reads of every fresh burst of connections come without a kernel time."""
    global _HOLDER
    if _HOLDER is None and SO_TIMESTAMPNS is not None:
        holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            holder.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            holder.close()
            return
        _HOLDER = holder


def kernel_stamps_available() -> bool:
    return SO_TIMESTAMPNS is not None and _TIMESPEC is not None and STAMP_SPACE > 0 and \
        hasattr(socket.socket, "recvmsg")


class KernelStampedTransport(asyncio.Transport):
    """See the module docstring. The protocol gets `read_stamp` (unix seconds or None) per read."""

    # Not asyncio's 256 KiB: Python allocates the whole size for every read, and above glibc's
    # mmap threshold (128 KiB) that is an mmap, page faults and a munmap per read: 16 us a read
    # against 4 us at 64 KiB on the shared 2-core machine. Token events are a few hundred bytes.
    max_size = 64 * 1024

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket,
                 protocol: asyncio.Protocol) -> None:
        extra: dict[str, Any] = {"socket": sock}
        try:
            extra["sockname"] = sock.getsockname()
            extra["peername"] = sock.getpeername()
        except OSError:
            pass
        super().__init__(extra)
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._buffer = bytearray()
        self._closing = False
        self._lost = False  # connection_lost scheduled
        self._reading = False
        self._writing = False
        sock.setblocking(False)
        assert SO_TIMESTAMPNS is not None
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        keep_kernel_stamping_on()
        protocol.connection_made(self)
        self.resume_reading()

    # --- reading ---------------------------------------------------------------------------
    def _read_ready(self) -> None:
        try:
            data, ancdata, _, _ = self._sock.recvmsg(self.max_size, STAMP_SPACE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        protocol = self._protocol
        if not data:
            self.pause_reading()
            try:
                keep_open = protocol.eof_received()
            except Exception as exc:
                self._force_close(exc)
                return
            if not keep_open:
                self.close()
            return
        protocol.read_stamp = kernel_stamp(ancdata)  # type: ignore[attr-defined]
        try:
            protocol.data_received(data)
        except Exception as exc:
            self._force_close(exc)

    def is_reading(self) -> bool:
        return self._reading

    def pause_reading(self) -> None:
        if self._reading:
            self._reading = False
            self._loop.remove_reader(self._fd)

    def resume_reading(self) -> None:
        if not self._reading and not self._closing:
            self._reading = True
            self._loop.add_reader(self._fd, self._read_ready)

    # --- writing ---------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        if not self._buffer:
            try:
                sent = self._sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError as exc:
                self._force_close(exc)
                return
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            self._writing = True
            self._loop.add_writer(self._fd, self._write_ready)
        self._buffer += data

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del self._buffer[:sent]
        if not self._buffer:
            self._stop_writing()
            if self._closing:
                self._connection_lost(None)

    def _stop_writing(self) -> None:
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return len(self._buffer)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return (0, 0)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # requests are small; the buffer is never large enough to need flow control

    # --- closing ---------------------------------------------------------------------------
    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        self.pause_reading()
        if not self._buffer:
            self._connection_lost(None)

    def abort(self) -> None:
        self._force_close(None)

    def _force_close(self, exc: Exception | None) -> None:
        self._closing = True
        self.pause_reading()
        self._buffer.clear()
        self._stop_writing()
        self._connection_lost(exc)

    def _connection_lost(self, exc: Exception | None) -> None:
        if self._lost:
            return
        self._lost = True
        self._loop.call_soon(self._call_connection_lost, exc)

    def _call_connection_lost(self, exc: Exception | None) -> None:
        try:
            self._protocol.connection_lost(exc)
        finally:
            self._sock.close()

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._protocol = protocol  # type: ignore[assignment]
