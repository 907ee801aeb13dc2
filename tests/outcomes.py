"""How vLLM 0.32 counts each request outcome (measured on the real CPU server, docs/slo.md), and a
reader of those counts: the real server and the simulator are held to the same table."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from crossover import catalog, slo

# outcome -> {count key: increase}; keys not listed must not move.
MEASURED: dict[str, dict[str, float]] = {
    # max_tokens over max_model_len, an unknown model, a body that is not JSON: only the HTTP 4xx.
    "bad_input": {"http:4xx": 1},
    # A client reads a few tokens and closes the connection: a 2xx, no finished_reason, and the
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


def cut_stream(url: str, model: str, lines: int = 4) -> None:
    """Start a long streamed completion, read a few event lines, then close the socket."""
    parts = urlsplit(url)
    body = json.dumps({"model": model, "prompt": "w1 w2 w3 w4", "max_tokens": 1000, "ignore_eos": True,
                       "stream": True}).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        seen = b""
        while seen.count(b"data: ") < lines:
            chunk = sock.recv(4096)
            if not chunk:
                break
            seen += chunk
    time.sleep(0.5)
