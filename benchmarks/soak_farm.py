"""The soak's target farm: N vLLM-like /metrics targets in one light aiohttp process on loopback,
one path per target (`/t0/metrics` ... `/t{N-1}/metrics`), with per-target faults the soak
switches on and off through `POST /admin/faults`.

Payloads are the captured real vLLM 0.32.0 /metrics (about 50 KB) with every counter and histogram
series scaled up per scrape (64 precomputed generations, so serving costs no formatting), so rates
are non-zero and a "restart" fault is a real counter reset. Faults (per target):

    down       the connection is cut before any answer            -> reason connection/read
    status500  HTTP 500                                           -> http_status
    slow       the answer comes after `slow_s` (beyond the timeout) -> timeout
    malformed  a broken sample line half-way down (the simulator's own injector) -> parse
    truncated  Content-Length of the whole, half sent, then cut   -> read
    restart    counters back to generation 0 (a counter reset); the target stays up
    legacy     the renamed families under their old (pre-0.11) names; the target stays up

Run by benchmarks/soak.py: `python benchmarks/soak_farm.py --port P --targets N`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import random
import re
import sys
from pathlib import Path

from aiohttp import web

from crossover import catalog
from crossover.sim.metrics import malformed

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-0.32.0-under-load.prom"
GENERATIONS = 64
FAULT_KINDS = ("down", "status500", "slow", "malformed", "truncated", "restart", "legacy")
PREFIX = catalog.GENERATION_TOKENS.name.split(":")[0] + ":"
_CUMULATIVE = re.compile(r"^(\S+?)(_total|_count|_sum|_bucket)(\{[^}]*\})? (\S+)$")


def generations(text: str, count: int = GENERATIONS) -> list[bytes]:
    """The payload with its vLLM counters and histograms scaled by 1 + g/10 for g in 0..count-1."""
    lines = text.split("\n")
    scalable = [(i, m) for i, line in enumerate(lines)
                if line.startswith(PREFIX) and (m := _CUMULATIVE.match(line)) is not None]
    out = []
    for g in range(count):
        factor = 1.0 + g / 10.0
        copy = list(lines)
        for index, match in scalable:
            value = float(match.group(4)) * factor
            copy[index] = f"{match.group(1)}{match.group(2)}{match.group(3) or ''} {value!r}"
        out.append("\n".join(copy).encode())
    return out


def legacy(payload: bytes) -> bytes:
    """The families vLLM renamed, under their old names (what a pre-0.11 server exposes)."""
    text = payload.decode()
    for metric in catalog.CATALOG.metrics:
        if metric.aliases:
            text = re.sub(re.escape(metric.name) + r"(?=[_{ \n])", metric.aliases[-1], text)
    return text.encode()


class Farm:
    def __init__(self, targets: int, slow_s: float) -> None:
        self.payloads = generations(FIXTURE.read_text())
        self.legacy = [legacy(p) for p in self.payloads]
        self.broken = [malformed(p) for p in self.payloads]
        self.scrapes = [0] * targets
        self.faults: dict[int, str] = {}
        self.slow_s = slow_s
        self.served = 0

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        index = int(request.match_info["index"])
        if not 0 <= index < len(self.scrapes):
            raise web.HTTPNotFound()
        fault = self.faults.get(index)
        self.served += 1
        if fault == "restart":
            self.scrapes[index] = 0
            del self.faults[index]  # one reset, then it counts up again
        generation = self.scrapes[index] % GENERATIONS
        self.scrapes[index] += 1
        payload = self.payloads[generation]
        if fault == "down":
            if request.transport is not None:
                request.transport.abort()
            return web.Response(status=500)
        if fault == "status500":
            return web.Response(status=500, text="engine dead")
        if fault == "slow":
            await asyncio.sleep(self.slow_s)
        elif fault == "malformed":
            payload = self.broken[generation]
        elif fault == "legacy":
            payload = self.legacy[generation]
        elif fault == "truncated":
            response = web.StreamResponse(headers={"Content-Type": "text/plain; version=0.0.4"})
            response.content_length = len(payload)
            await response.prepare(request)
            await response.write(payload[: len(payload) // 2])
            if request.transport is not None:
                request.transport.abort()
            return response
        return web.Response(body=payload, headers={"Content-Type": "text/plain; version=0.0.4"})

    async def set_faults(self, request: web.Request) -> web.Response:
        """{"fraction": 0.2, "seed": 1}: that share of targets gets a fault, kinds in turn; 0 clears."""
        body = await request.json()
        fraction = float(body.get("fraction", 0.0))
        rng = random.Random(int(body.get("seed", 0)))
        chosen = rng.sample(range(len(self.scrapes)), round(fraction * len(self.scrapes)))
        self.faults = {index: FAULT_KINDS[n % len(FAULT_KINDS)] for n, index in enumerate(chosen)}
        counts: dict[str, int] = {}
        for kind in self.faults.values():
            counts[kind] = counts.get(kind, 0) + 1
        return web.json_response(counts)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.served, "faults": len(self.faults)})


async def _exit_with_parent(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(0.5)
    os._exit(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--slow", type=float, default=10.0, help="seconds a slow target takes")
    args = parser.parse_args()
    # Cut connections and timed-out slow answers are the point here, not errors worth a traceback.
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    farm = Farm(args.targets, args.slow)
    app = web.Application()
    app.router.add_get("/t{index:\\d+}/metrics", farm.metrics)
    app.router.add_post("/admin/faults", farm.set_faults)
    app.router.add_get("/admin/stats", farm.stats)
    app.router.add_get("/health", lambda request: _ok())
    parent = os.getppid()

    async def watch(app: web.Application) -> None:
        app["watch"] = asyncio.ensure_future(_exit_with_parent(parent))

    app.on_startup.append(watch)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None, backlog=2048)
    return 0


async def _ok() -> web.Response:
    return web.Response(text="ok\n")


if __name__ == "__main__":
    sys.exit(main())
