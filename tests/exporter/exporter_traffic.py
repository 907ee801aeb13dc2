"""A small streaming client for the exporter tests: sends completions and times them client-side
(TTFT = first token chunk - send; TPOT = (last - first) / (tokens - 1), as `vllm bench serve`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp


@dataclass(frozen=True)
class Timed:
    ttft: float
    tpot: float
    e2e: float
    tokens: int


async def _one(session: aiohttp.ClientSession, base_url: str, model: str, prompt_tokens: int,
               max_tokens: int) -> Timed:
    body = {"model": model, "prompt": list(range(1, prompt_tokens + 1)), "max_tokens": max_tokens,
            "stream": True, "ignore_eos": True}
    sent = time.perf_counter()
    first: float | None = None
    last = sent
    tokens = 0
    async with session.post(base_url + "/v1/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if not event.get("choices"):
                continue
            now = time.perf_counter()
            if first is None:
                first = now
            last = now
            tokens += 1
    assert first is not None and tokens > 0
    tpot = (last - first) / (tokens - 1) if tokens > 1 else 0.0
    return Timed(first - sent, tpot, last - sent, tokens)


async def send(base_urls: list[str], model: str, requests: int, *, concurrency: int = 8,
               prompt_tokens: tuple[int, ...] = (32, 512), max_tokens: int = 12) -> list[Timed]:
    """`requests` streamed completions spread round-robin over base_urls, prompt lengths cycling."""
    semaphore = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        async def limited(index: int) -> Timed:
            async with semaphore:
                return await _one(session, base_urls[index % len(base_urls)], model,
                                  prompt_tokens[index % len(prompt_tokens)], max_tokens)
        return list(await asyncio.gather(*(limited(i) for i in range(requests))))


def send_sync(base_urls: list[str], model: str, requests: int, **kwargs: object) -> list[Timed]:
    return asyncio.run(send(base_urls, model, requests, **kwargs))  # type: ignore[arg-type]
