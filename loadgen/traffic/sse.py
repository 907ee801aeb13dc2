"""An incremental Server-Sent Events parser for OpenAI-style streams that survives garbage.

Bytes arrive in arbitrary pieces: one TCP read may hold half an event or several events. `feed`
returns the complete events' `data:` payloads in order; the caller parses JSON. Anything that is
not an event we understand (comments, other fields, lines without a colon) is counted, not fatal.
The hot path is `bytes.find` and slicing: about one event per microsecond-scale step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DONE = b"[DONE]"
MAX_PENDING_BYTES = 4 * 1024 * 1024  # one event larger than this means the stream is not SSE


class SSEOverflow(Exception):
    """The stream sent more than MAX_PENDING_BYTES without an event boundary."""


@dataclass
class SSEParser:
    pending: bytes = b""
    garbage: int = 0  # lines that were neither data nor an SSE field we ignore on purpose
    _cr: bool = field(default=False, repr=False)

    def feed(self, chunk: bytes) -> list[bytes]:
        """Add received bytes; return the `data` payloads of every event now complete."""
        if chunk[-2:] == b"\n\n" and chunk.startswith(b"data: ") and chunk.find(b"\n") == len(chunk) - 2 \
                and not self.pending and not self._cr and b"\r" not in chunk:
            return [chunk[6:-2]]  # the common read, one token's event: one `data:` line, nothing pending
        if b"\r" in chunk or self._cr:
            # CRLF and lone CR are legal line ends in SSE; fold them into LF. A CR at the end of
            # one read may pair with an LF at the start of the next.
            chunk = (b"\r" if self._cr else b"") + chunk
            self._cr = chunk.endswith(b"\r")
            if self._cr:
                chunk = chunk[:-1]
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self.pending + chunk if self.pending else chunk
        events: list[bytes] = []
        start = 0
        while True:
            end = buffer.find(b"\n\n", start)
            if end < 0:
                break
            payload = self._event_data(buffer[start:end])
            if payload is not None:
                events.append(payload)
            start = end + 2
        self.pending = buffer[start:]
        if len(self.pending) > MAX_PENDING_BYTES:
            raise SSEOverflow(f"no event boundary in {len(self.pending)} bytes")
        return events

    def finish(self) -> list[bytes]:
        """The stream ended: a last event without its blank line still counts."""
        tail, self.pending = self.pending, b""
        if not tail.strip():
            return []
        payload = self._event_data(tail.rstrip(b"\n"))
        return [] if payload is None else [payload]

    def _event_data(self, block: bytes) -> bytes | None:
        # The common case, one `data: {...}` line, without splitting.
        if block.startswith(b"data:") and b"\n" not in block:
            return block[6:] if block[5:6] == b" " else block[5:]
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if not line or line.startswith(b":"):
                continue  # empty or comment (keep-alive)
            name, colon, value = line.partition(b":")
            if not colon:
                self.garbage += 1
                continue
            if value.startswith(b" "):
                value = value[1:]
            if name == b"data":
                data.append(value)
            elif name not in (b"event", b"id", b"retry"):
                self.garbage += 1
        return b"\n".join(data) if data else None
