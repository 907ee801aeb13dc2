"""The emitter thread that writes streamed tokens at their steps' scheduled ends (sim/_emitter.c,
sim/fastpath.py): its own contract on real sockets, and the streams it serves against the loop's."""

from __future__ import annotations

import json
import os
import re
import select
import socket
import struct
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from crossover.netutil import spec_on_free_ports
from crossover.sim import fastpath
from crossover.sim.fleet import running_fleet, with_overrides
from crossover.spec import load_spec
from tests.helpers import SPECS
from tests.sim.sim_client import get_json, stream

native = pytest.importorskip("crossover.sim._emitter", reason="the emitter module is not built")
SPEC = load_spec(SPECS / "seed-70b-h100.yaml")


@pytest.fixture
def emitter() -> Iterator[tuple[Any, int]]:
    notify = os.eventfd(0, os.EFD_CLOEXEC)
    writer = native.Emitter(notify)
    yield writer, notify
    writer.close()
    os.close(notify)


Batch = tuple[int, list[float], list[int], float]


def wait_batches(writer: Any, notify: int, count: int, timeout: float = 5) -> list[Batch]:
    got: list[Batch] = []
    deadline = time.monotonic() + timeout
    while len(got) < count:
        ready, _, _ = select.select([notify], [], [], max(0.0, deadline - time.monotonic()))
        assert ready, f"only {len(got)} of {count} batches reported"
        os.eventfd_read(notify)
        got += writer.collect()
    return got


def test_writes_each_batch_in_order_at_its_start(emitter: tuple[Any, int]) -> None:
    writer, notify = emitter
    pairs = [socket.socketpair() for _ in range(3)]
    try:
        now = time.monotonic()
        late = writer.submit(now + 0.15, [pairs[0][0].fileno()], [b"second"])
        early = writer.submit(now + 0.05, [p[0].fileno() for p in pairs], [b"first-%d" % i for i in range(3)])
        batches = wait_batches(writer, notify, 2)
        assert [b[0] for b in batches] == [early, late]  # by start time, not by submission
        (_, times, sent, woke), (_, late_times, late_sent, _) = batches
        assert now + 0.05 <= woke <= times[0]
        assert sent == [7, 7, 7] and late_sent == [6]
        assert now + 0.05 <= times[0] < now + 0.05 + 0.05 and times == sorted(times)
        assert late_times[0] >= now + 0.15
        assert pairs[0][1].recv(100) == b"first-0second"
        assert [p[1].recv(100) for p in pairs[1:]] == [b"first-1", b"first-2"]
    finally:
        for a, b in pairs:
            a.close()
            b.close()


def test_a_full_socket_blocks_its_descriptor_until_released(emitter: tuple[Any, int]) -> None:
    writer, notify = emitter
    sender, reader = socket.socketpair()
    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    try:
        chunk = b"x" * 65536
        writer.submit(time.monotonic(), [sender.fileno()] * 64, [chunk] * 64)
        (_, _, sent, _), = wait_batches(writer, notify, 1)
        short = next(i for i, n in enumerate(sent) if n != len(chunk))
        assert sent[short] >= 0 or sent[short] == -11  # a partial write, or EAGAIN
        assert all(n == -11 for n in sent[short + 1:])  # not attempted after the first short write
        assert writer.blocked(sender.fileno())
        reader.setblocking(False)
        while True:  # the client catches up
            try:
                reader.recv(1 << 20)
            except BlockingIOError:
                break
        writer.release(sender.fileno())
        assert not writer.blocked(sender.fileno())
        writer.submit(time.monotonic(), [sender.fileno()], [b"again"])
        (_, _, sent, _), = wait_batches(writer, notify, 1)
        assert sent == [5]
    finally:
        sender.close()
        reader.close()


def test_a_closed_peer_is_an_error_not_a_crash(emitter: tuple[Any, int]) -> None:
    writer, notify = emitter
    sender, reader = socket.socketpair()
    reader.close()
    try:
        writer.submit(time.monotonic(), [sender.fileno()], [b"lost"])
        (_, _, sent, _), = wait_batches(writer, notify, 1)
        assert sent[0] < 0 and sent[0] != -11  # -EPIPE: reported, no SIGPIPE
    finally:
        sender.close()


def test_bad_arguments_are_refused(emitter: tuple[Any, int]) -> None:
    writer, _ = emitter
    with pytest.raises(ValueError, match="differ in length"):
        writer.submit(0.0, [1, 2], [b"a"])
    with pytest.raises(TypeError, match="bytes"):
        writer.submit(0.0, [1], ["text"])
    with pytest.raises(ValueError, match="out of range"):
        writer.submit(0.0, [-1], [b"a"])


def test_the_emitter_mode_is_checked() -> None:
    assert fastpath.threaded("auto") and fastpath.threaded("thread") and not fastpath.threaded("loop")
    with pytest.raises(ValueError, match="thread, loop"):
        fastpath.threaded("threads")


def raw_response(url: str, path: str, body: dict[str, Any]) -> bytes:
    """The whole HTTP response of a streamed request, as bytes off the socket."""
    host, port = url.rsplit("/", 1)[-1].split(":")
    payload = json.dumps({**body, "stream": True}).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/%s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                     % (path.encode(), len(payload), payload))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_thread_and_loop_serve_the_same_bytes() -> None:
    """Both writers frame the same chunks: only ids, created times and the Date header differ."""
    requests: list[tuple[str, dict[str, Any]]] = [
        ("completions", {"prompt": "a b c", "stream_options": {"include_usage": True}}),
        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}]})]
    varying = [('"id":"[a-z]+-[0-9a-f]+"', '"id":"ID"'), ('"created":[0-9]+', '"created":0'),
               ("Date: [^\r]+", "Date: D")]

    def responses(mode: str) -> list[str]:
        spec = spec_on_free_ports(SPEC)
        url = spec.topology("tp4x1").instances[0].url
        out = []
        with running_fleet(spec, emitter=mode):
            for path, extra in requests:
                body = {"model": spec.model.name, "max_tokens": 6, "ignore_eos": True, **extra}
                text = raw_response(url, path, body).decode()
                for pattern, same in varying:
                    text = re.sub(pattern, same, text)
                out.append(text)
        return out

    threaded, looped = responses("thread"), responses("loop")
    assert threaded == looped
    assert threaded[0].count("data: {") == 7 and threaded[0].endswith("0\r\n\r\n")


@pytest.mark.parametrize("mode", ["thread", "loop"])
def test_many_streams_and_cut_clients_leak_no_descriptors(mode: str) -> None:
    """Streams that finish and clients that reset mid-stream: every duplicate descriptor is closed,
    every finished stream is whole, and the engine is left with nothing running."""
    spec = spec_on_free_ports(SPEC)
    url = spec.topology("tp2x2").instances[0].url
    host, port = url.rsplit("/", 1)[-1].split(":")
    with running_fleet(spec, emitter=mode) as fleet:
        stream(url + "/v1/completions", {"model": spec.model.name, "prompt": "warm", "max_tokens": 2})
        before = len(os.listdir("/proc/self/fd"))
        cut = []
        for _ in range(6):  # clients that vanish with a reset after their first token
            sock = socket.create_connection((host, int(port)), timeout=30)
            payload = json.dumps({"model": spec.model.name, "prompt": "x", "max_tokens": 400,
                                  "ignore_eos": True, "stream": True}).encode()
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
            assert b"data: {" in sock.recv(65536) + sock.recv(65536)
            cut.append(sock)
        for sock in cut:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.close()
        whole = [stream(url + "/v1/completions", {"model": spec.model.name, "prompt": "y", "max_tokens": 20,
                                                  "ignore_eos": True}) for _ in range(5)]
        assert all(len(events) == 20 for events in whole)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            stats = get_json(url + "/admin/stats")
            if stats["running"] == 0 and len(os.listdir("/proc/self/fd")) <= before:
                break
            time.sleep(0.1)
        assert stats["running"] == 0, "cut streams still running"
        assert len(os.listdir("/proc/self/fd")) <= before, "descriptors left open"
        engine = fleet.instance(spec.topology("tp2x2").instances[0].name).engine
        assert isinstance(engine.writer, fastpath.ThreadWriter) == (mode == "thread")



def test_short_steps_keep_every_stream_in_order() -> None:
    """Steps well under a millisecond (time scale 200) on two instances sharing the emitter, many
    streams each: bursts are shifted apart (up to 10 ms, many steps), yet every stream's tokens leave
    in order and none is lost."""
    spec = spec_on_free_ports(with_overrides(SPEC, time_scale=200))
    urls = [i.url for i in spec.topology("tp2x2").instances]
    with running_fleet(spec, emitter="thread"), ThreadPoolExecutor(48) as pool:
        runs = list(pool.map(lambda n: stream(urls[n % 2] + "/v1/completions", {
            "model": spec.model.name, "prompt": "x " * n, "max_tokens": 100 + n, "ignore_eos": True,
            "stream_options": {"continuous_usage_stats": True}}), range(48)))
    for n, events in enumerate(runs):
        assert [e["usage"]["completion_tokens"] for e in events] == list(range(1, 101 + n))


def test_an_instance_bursts_never_go_back_in_time() -> None:
    """Whatever the book proposes (it only keeps bursts apart), an instance's next burst never starts
    before its previous one: the thread writes by start time, a stream's tokens must stay in order."""

    class Book:
        proposals = iter([1.0050, 1.0020, 1.0100])

        def place(self, end: float, length: float, now: float) -> float:
            return next(self.proposals)

    writer = fastpath.ThreadWriter(Book(), emitter=None, on_close=lambda: None)  # type: ignore[arg-type]
    starts = [writer.burst_start(1.0 + k * 0.001, 0.001, 1.001) for k in range(3)]
    assert starts == [1.0050, 1.0050, 1.0100]
