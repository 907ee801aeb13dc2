"""How vLLM 0.32 counts each request outcome (measured on the real CPU server, docs/slo.md), and a
reader of those counts: the real server and the simulator are held to the same table."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Protocol
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog, slo

# outcome -> {count key: increase}; keys not listed must not move.
MEASURED: dict[str, dict[str, float]] = {
    # max_tokens over max_model_len, an unknown model, a body that is not JSON: only the HTTP 4xx.
    "bad_input": {"http:4xx": 1},
    # A client reads the first token and closes the connection: a 2xx, no finished_reason, and the
    # first token observed; the per-finished-request histograms do not see it.
    "cut_stream": {"http:2xx": 1, "ttft": 1},
    # A queue limit refuses the request: 503 and the admission counter.
    "rejected": {"http:5xx": 1, "rejected": 1},
    # An engine error (from vLLM's source: FinishReason.ERROR, answered 500, observed at finish).
    "engine_error": {"http:5xx": 1, "reason:error": 1, "e2e": 1},
}
WATCHED = ("http:2xx", "http:4xx", "http:5xx", "rejected", "e2e", "ttft",
           *(f"reason:{r}" for r in catalog.FINISHED_REASONS))


def counts(text: str) -> dict[str, float]:
    """The counts MEASURED speaks of, from one /metrics payload."""
    out = dict.fromkeys(WATCHED, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == catalog.HTTP_REQUESTS.name + "_total" and \
                    sample.labels.get("handler") in slo.SERVING_HANDLERS:
                out["http:" + sample.labels["status"]] += sample.value
            elif sample.name == catalog.ADMISSION_REJECTIONS.name + "_total":
                out["rejected"] += sample.value
            elif sample.name == catalog.REQUEST_SUCCESS.name + "_total":
                out["reason:" + sample.labels["finished_reason"]] += sample.value
            elif sample.name == catalog.E2E_LATENCY.name + "_count":
                out["e2e"] += sample.value
            elif sample.name == catalog.TTFT.name + "_count":
                out["ttft"] += sample.value
    return out


def increase(before: str, after: str) -> dict[str, float]:
    old, new = counts(before), counts(after)
    return {key: new[key] - old[key] for key in WATCHED if new[key] != old[key]}


class Engine(Protocol):
    def pause_engine(self) -> None: ...
    def run_engine_for(self, seconds: float) -> None: ...
    def resume_engine(self) -> None: ...


def cut_stream(url: str, model: str, engine: Engine | None = None, timeout_s: float = 60.0) -> None:
    """Start a long streamed completion, read its first token, close the socket, and return once the
    server has ended the response (its 2xx count moved). A busy server may write its first token only
    after the engine has finished the whole completion (seen on 2 cores), which then counts as finished;
    with `engine`, the engine runs in pulses of milliseconds until the first token is out and stays
    frozen until the server is done."""
    served = _served(url)
    parts = urlsplit(url)
    body = json.dumps({"model": model, "prompt": "w1 w2 w3 w4", "max_tokens": 1000, "ignore_eos": True,
                       "stream": True}).encode()
    if engine is not None:
        engine.pause_engine()
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=timeout_s) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            _read_first_event(sock, engine, time.monotonic() + timeout_s)
        deadline = time.monotonic() + timeout_s
        while _served(url) == served:
            assert time.monotonic() < deadline, f"{url} did not end a cut stream in {timeout_s:.0f} s"
            time.sleep(0.05)
    finally:
        if engine is not None:
            engine.resume_engine()


def _read_first_event(sock: socket.socket, engine: Engine | None, deadline: float) -> None:
    """Read until one server-sent event has arrived; a frozen engine gets a few milliseconds at a time."""
    seen = b""
    sock.settimeout(0.2)
    while b"data: " not in seen:
        assert time.monotonic() < deadline, "no streamed token before the deadline"
        if engine is not None:
            engine.run_engine_for(0.002)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            continue
        assert chunk, "the server closed the stream before its first token"
        seen += chunk


def _served(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        return counts(response.read().decode())["http:2xx"]
