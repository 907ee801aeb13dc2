"""The request bodies the sweep sends: streamed, with usage in every event, greedy, and as long
as planned (ignore_eos with min_tokens), for `/v1/completions` or `/v1/chat/completions`."""

from __future__ import annotations

import json

from crossover.loadgen.plan import Endpoint
from crossover.loadgen.traffic.dataset import SyntheticRequest

PATHS = {Endpoint.COMPLETIONS: "/v1/completions", Endpoint.CHAT: "/v1/chat/completions"}


def request_payload(model: str, request: SyntheticRequest, ignore_eos: bool,
                    endpoint: Endpoint = Endpoint.COMPLETIONS) -> bytes:
    body: dict[str, object] = {
        "model": model, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0, "ignore_eos": ignore_eos,
    }
    if endpoint is Endpoint.CHAT:
        body["messages"] = request.messages or [{"role": "user", "content": request.prompt}]
        body["max_completion_tokens"] = request.output_len
    else:
        body["prompt"] = request.prompt
        body["max_tokens"] = request.output_len
    if ignore_eos:
        body["min_tokens"] = request.output_len
    return json.dumps(body).encode()
