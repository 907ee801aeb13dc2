"""Seeded synthetic requests: the same prompts, lengths and arrival times for every topology.

Prompts are space-separated words `w0`..`w508`, the vocabulary of the project's tiny real-vLLM
tokenizer (crossover.realvllm), so one word is one token there; the simulator counts words too.
Random words per request keep prefix caching out of the picture, except for the shared prefix.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from crossover.loadgen.plan import Arrival, LengthDist, LengthKind, SweepPlan

VOCABULARY = tuple(f"w{i}" for i in range(509))
_BLOCK = 256  # requests drawn per block; the sequence does not depend on how many are consumed


@dataclass(frozen=True)
class SyntheticRequest:
    index: int  # position in the level's sequence; identical across topologies
    prompt: str
    input_len: int
    output_len: int


def _rng(plan: SweepPlan, level: float, stream: str) -> np.random.Generator:
    # One independent stream per (seed, level, purpose): the lengths do not move when the
    # arrival process changes, and topologies at one level see the same numbers.
    return np.random.default_rng([plan.seed, zlib.crc32(f"{level:g}/{stream}".encode())])


def _lengths(dist: LengthDist, rng: np.random.Generator, n: int) -> np.ndarray:
    if dist.kind is LengthKind.FIXED:
        return np.full(n, dist.low, dtype=np.int64)
    if dist.kind is LengthKind.UNIFORM:
        return rng.integers(dist.low, dist.high + 1, size=n)
    values = np.rint(rng.normal(dist.mean, dist.std, size=n))
    return np.clip(values, dist.low, dist.high).astype(np.int64)


def requests(plan: SweepPlan, level: float) -> Iterator[SyntheticRequest]:
    """The level's endless, deterministic request sequence (take as many as the level needs)."""
    rng = _rng(plan, level, "requests")
    prefix_rng = np.random.default_rng([plan.seed, 0xC0FFEE])
    vocabulary = np.array(VOCABULARY)
    prefix = " ".join(vocabulary[prefix_rng.integers(0, len(vocabulary), size=plan.shared_prefix)])
    index = 0
    while True:
        inputs = _lengths(plan.input_len, rng, _BLOCK)
        outputs = _lengths(plan.output_len, rng, _BLOCK)
        for n_in, n_out in zip(inputs.tolist(), outputs.tolist(), strict=True):
            own = max(1, n_in - plan.shared_prefix)
            words = " ".join(vocabulary[rng.integers(0, len(vocabulary), size=own)])
            prompt = f"{prefix} {words}" if prefix else words
            yield SyntheticRequest(index, prompt, plan.shared_prefix + own, int(n_out))
            index += 1


def arrival_offsets(plan: SweepPlan, rate: float, n: int) -> np.ndarray:
    """Send times (seconds from the level's start) of n open-loop requests at `rate` req/s.

    Gaps are gamma(shape=burstiness, mean 1) in units of the cumulative arrival intensity, so
    burstiness 1 is Poisson (as in `vllm bench serve`). With a ramp the intensity rises linearly
    from 0 to `rate` over ramp_s: the unit-rate times are mapped through the inverse of
    Lambda(t) = rate t^2 / (2 ramp) (t < ramp), rate ramp / 2 + rate (t - ramp) after.
    """
    rng = _rng(plan, rate, "arrivals")
    shape = 1.0 if plan.arrival is Arrival.POISSON else plan.burstiness
    gaps = rng.gamma(shape, 1.0 / shape, size=n)
    units = np.cumsum(gaps) - gaps[0]  # the first request goes at once
    if plan.ramp_s <= 0:
        return units / rate
    knee = rate * plan.ramp_s / 2
    return np.where(units < knee, np.sqrt(2 * plan.ramp_s * units / rate),
                    plan.ramp_s + (units - knee) / rate)
