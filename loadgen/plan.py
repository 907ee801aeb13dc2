"""What a sweep does: the load levels, the synthetic requests' shape, trimming, timeouts and SLOs.

A `SweepPlan` is plain frozen data. It is written to `plan.json` in the run folder so a rerun can
check that it resumes the same experiment, and so `load_run` can tell how a past run was made.
Every bad value raises `UserError` with one line naming the field.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from typing import Any, overload

import numpy as np

from crossover.errors import UserError
from crossover.slo import SLO_KINDS


class Mode(StrEnum):
    """The load axis, its one definition: closed loop (a fixed number of requests in flight, the
    levels are concurrencies) or open loop (requests arrive at a rate whatever the server does, the
    levels are request rates). Its value is run.json's plan.mode; `axis` names it where the load is
    a number: crossover.json, result files, the flags (--concurrency, --rate) and every sentence,
    and `of_axis` reads that name back. Curves are interpolated on its scale: log2 concurrency,
    linear rate (`scale`, `unscale`)."""

    CLOSED = "closed"
    OPEN = "open"

    @property
    def axis(self) -> str:
        """The axis' name: "concurrency" or "rate"."""
        return "concurrency" if self is Mode.CLOSED else "rate"

    @classmethod
    def of_axis(cls, name: str) -> Mode:
        """The load axis named "concurrency" or "rate" (ValueError for any other name)."""
        for mode in cls:
            if mode.axis == name:
                return mode
        raise ValueError(f"unknown load axis {name!r} (want concurrency or rate)")

    @overload
    def scale(self, levels: float) -> float: ...
    @overload
    def scale(self, levels: np.ndarray) -> np.ndarray: ...

    def scale(self, levels: float | np.ndarray) -> float | np.ndarray:
        """Levels as positions on the axis the curves are interpolated on: log2 of a concurrency
        (doubling it is one step), a rate as it is. Arrays go through numpy, numbers through math,
        as each always did: the two logarithms differ in the last bit for a few numbers."""
        if isinstance(levels, np.ndarray):
            return np.log2(levels) if self is Mode.CLOSED else levels.astype(float)
        return math.log2(levels) if self is Mode.CLOSED else levels

    def unscale(self, position: float) -> float:
        """The level at a position on the axis (scale's inverse)."""
        return float(2.0**position) if self is Mode.CLOSED else float(position)


class Arrival(StrEnum):
    POISSON = "poisson"
    GAMMA = "gamma"  # burstiness < 1 is burstier than Poisson, > 1 more regular


class Endpoint(StrEnum):
    COMPLETIONS = "completions"  # /v1/completions; random prompts go as token ids
    CHAT = "chat"  # /v1/chat/completions; prompts as user messages


class DatasetKind(StrEnum):
    RANDOM = "random"  # seeded random tokens of the asked lengths
    JSONL = "jsonl"  # one {"prompt"| "messages", optional "output_len"} object per line
    SHAREGPT = "sharegpt"  # a JSON list of {"conversations": [{"from", "value"}, ...]}


class LengthKind(StrEnum):
    FIXED = "fixed"
    UNIFORM = "uniform"
    NORMAL = "normal"


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: fixed N, uniform in [low, high], or normal(mean, std) clipped
    to [low, high]."""

    kind: LengthKind = LengthKind.FIXED
    mean: float = 128.0
    std: float = 0.0
    low: int = 1
    high: int = 128

    def __post_init__(self) -> None:
        if self.low < 1 or self.high < self.low:
            raise UserError(f"length distribution: need 1 <= low <= high, got {self.low}-{self.high}")
        if self.std < 0 or not math.isfinite(self.std) or not math.isfinite(self.mean):
            raise UserError(f"length distribution: bad mean/std {self.mean}/{self.std}")

    @classmethod
    def fixed(cls, n: int) -> LengthDist:
        if n < 1:
            raise UserError(f"length must be at least 1, got {n}")
        return cls(LengthKind.FIXED, float(n), 0.0, n, n)

    @classmethod
    def parse(cls, text: str, what: str = "length") -> LengthDist:
        """"128", "uniform:64-256", "normal:128,32" or "normal:128,32,16-512" (bounds)."""
        value = str(text).strip()
        try:
            if value.isdigit():
                return cls.fixed(int(value))
            kind, _, rest = value.partition(":")
            if kind == "uniform":
                low, high = (int(x) for x in rest.split("-"))
                return cls(LengthKind.UNIFORM, (low + high) / 2, 0.0, low, high)
            if kind == "normal":
                parts = rest.split(",")
                mean, std = float(parts[0]), float(parts[1])
                if len(parts) == 3:
                    low, high = (int(x) for x in parts[2].split("-"))
                elif len(parts) == 2:
                    low, high = 1, max(1, math.ceil(mean + 4 * std))
                else:
                    raise ValueError
                return cls(LengthKind.NORMAL, mean, std, low, high)
        except (ValueError, IndexError):
            pass
        except UserError as exc:  # readable but out of range: say which option it came from
            raise UserError(f"{what}: {exc}") from None
        raise UserError(f"{what}: cannot read {text!r} (use N, uniform:LOW-HIGH, normal:MEAN,STD or "
                        "normal:MEAN,STD,LOW-HIGH)")

    def describe(self) -> str:
        if self.kind is LengthKind.FIXED:
            return str(self.low)
        if self.kind is LengthKind.UNIFORM:
            return f"uniform:{self.low}-{self.high}"
        return f"normal:{self.mean:g},{self.std:g},{self.low}-{self.high}"


@dataclass(frozen=True)
class TopologyInfo:
    """Where a topology's traffic went: what both the traffic and the result files record."""
    name: str
    gpus: int
    targets: tuple[str, ...]  # URLs traffic went to (entrypoint, or the balanced instances)
    balance: str  # "entrypoint", "round_robin" or "least_outstanding"


@dataclass(frozen=True)
class SweepPlan:
    """One sweep: every topology gets the same seeded requests at every level.

    Closed loop: `levels` are concurrencies; each level sends `requests_per_level` requests, or
    `rounds` x concurrency when that is None, or keeps going for `duration_s`.
    Open loop: `levels` are request rates (req/s) with Poisson or gamma arrivals; each level sends
    `requests_per_level` requests, or rate x `duration_s`.
    """

    mode: Mode = Mode.CLOSED
    levels: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
    requests_per_level: int | None = None
    rounds: float = 4.0
    duration_s: float | None = None
    input_len: LengthDist = field(default_factory=lambda: LengthDist.fixed(128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist.fixed(64))
    ignore_eos: bool = True
    shared_prefix: int = 0  # tokens (words) common to every prompt, at its start
    seed: int = 0
    warmup_s: float = 0.0  # requests sent in the first warmup_s of a level are not counted
    cooldown_s: float = 0.0  # nor those ending in its last cooldown_s
    timeout_s: float = 120.0  # per request; a late request counts as failed
    ramp_s: float = 0.0  # closed: workers start spread over ramp_s; open: rate rises linearly
    arrival: Arrival = Arrival.POISSON
    burstiness: float = 1.0
    # every level's arrivals one seeded unit-rate sequence scaled to its rate, not a draw of its own:
    # levels then differ only by rate (the capacity planner's ground truth draws them so, and
    # `capacity --validate` sweeps them so: capacity/evaluate.py, Workload.open_sweep)
    shared_arrivals: bool = False
    slos_ms: dict[str, float] | None = None  # overrides spec.slos thresholds (ms) when given
    objective: float | None = None  # overrides spec.slos.objective
    min_requests: int = 1
    # workload: which endpoint, where prompts come from, and how their tokens are counted
    endpoint: Endpoint = Endpoint.COMPLETIONS
    dataset: DatasetKind = DatasetKind.RANDOM
    dataset_path: str | None = None
    tokenizer: str | None = None  # a local tokenizer folder; None: the server's /tokenize
    turns: int = 1  # requests per conversation: each turn sends the history and a new user message
    think_time_s: float = 0.0  # pause between a turn's answer and the next turn

    def __post_init__(self) -> None:
        if not self.levels:
            raise UserError("plan.levels: give at least one level")
        if any(not math.isfinite(x) or x <= 0 for x in self.levels):
            raise UserError(f"plan.levels: every level must be positive, got {list(self.levels)}")
        if len(set(self.levels)) != len(self.levels):
            raise UserError(f"plan.levels: duplicate levels in {list(self.levels)}")
        if self.mode is Mode.CLOSED and any(x != int(x) for x in self.levels):
            raise UserError(f"plan.levels: concurrencies must be whole numbers, got {list(self.levels)}")
        if self.requests_per_level is not None and self.requests_per_level < 1:
            raise UserError(f"plan.requests_per_level: must be at least 1, got {self.requests_per_level}")
        if self.duration_s is not None and not (0 < self.duration_s < math.inf):
            raise UserError(f"plan.duration_s: must be positive, got {self.duration_s}")
        if self.mode is Mode.OPEN and self.requests_per_level is None and self.duration_s is None:
            raise UserError("plan: an open-loop sweep needs requests_per_level or duration_s")
        if not (self.rounds > 0 and math.isfinite(self.rounds)):
            raise UserError(f"plan.rounds: must be positive, got {self.rounds}")
        for name in ("warmup_s", "cooldown_s", "ramp_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise UserError(f"plan.{name}: must be zero or positive, got {value}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise UserError(f"plan.timeout_s: must be positive, got {self.timeout_s}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise UserError(f"plan.burstiness: must be positive, got {self.burstiness}")
        if self.shared_prefix < 0:
            raise UserError(f"plan.shared_prefix: must be zero or positive, got {self.shared_prefix}")
        if self.slos_ms is not None:
            for name, value in self.slos_ms.items():
                if name not in SLO_KINDS:
                    raise UserError(f"plan.slos_ms: unknown SLO {name!r} (use {', '.join(SLO_KINDS)})")
                if not (value > 0 and math.isfinite(value)):
                    raise UserError(f"plan.slos_ms: {name} must be a positive number of ms, got {value}")
        if (self.dataset is DatasetKind.RANDOM) != (self.dataset_path is None):
            raise UserError("plan.dataset_path: a jsonl or sharegpt dataset needs a file, random needs none")
        if self.turns < 1:
            raise UserError(f"plan.turns: must be at least 1, got {self.turns}")
        if self.turns > 1 and self.endpoint is not Endpoint.CHAT:
            raise UserError("plan.turns: a conversation of several turns needs --endpoint chat")
        if self.turns > 1 and self.dataset is DatasetKind.JSONL:
            raise UserError("plan.turns: JSONL prompts are single requests; use random or sharegpt for turns")
        if not (self.think_time_s >= 0 and math.isfinite(self.think_time_s)):
            raise UserError(f"plan.think_time_s: must be zero or positive, got {self.think_time_s}")
        if self.objective is not None and not (0 < self.objective < 1):
            raise UserError(f"plan.objective: must be between 0 and 1, got {self.objective}")
        object.__setattr__(self, "levels", tuple(sorted(float(x) for x in self.levels)))

    @property
    def axis(self) -> str:
        """The load axis' name, "concurrency" or "rate" (see Mode)."""
        return self.mode.axis

    def conversations_for(self, level: float) -> int | None:
        """How many conversations (of `turns` requests each) a level starts; None for a duration."""
        total = self.requests_for(level)
        return None if total is None else math.ceil(total / self.turns)

    def requests_for(self, level: float) -> int | None:
        """How many requests a level sends; None when it runs for duration_s instead."""
        if self.requests_per_level is not None:
            return self.requests_per_level
        if self.mode is Mode.OPEN:
            assert self.duration_s is not None
            return max(self.min_requests, math.ceil(level * self.duration_s))
        if self.duration_s is not None:
            return None
        return max(self.min_requests, math.ceil(self.rounds * level))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mode"] = self.mode.value
        data["arrival"] = self.arrival.value
        data["endpoint"] = self.endpoint.value
        data["dataset"] = self.dataset.value
        data["levels"] = list(self.levels)
        for name in ("input_len", "output_len"):
            data[name] = {**data[name], "kind": getattr(self, name).kind.value}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SweepPlan:
        data = dict(data)
        data["mode"] = Mode(data["mode"])
        data["arrival"] = Arrival(data["arrival"])
        data["endpoint"] = Endpoint(data.get("endpoint", Endpoint.COMPLETIONS))
        data["dataset"] = DatasetKind(data.get("dataset", DatasetKind.RANDOM))
        data["levels"] = tuple(data["levels"])
        for name in ("input_len", "output_len"):
            length = dict(data[name])
            length["kind"] = LengthKind(length["kind"])
            data[name] = LengthDist(**length)
        return cls(**data)


def level_key(plan: SweepPlan, level: float, repeat: int = 1) -> str:
    """A file-name-safe name of a level: c16 or r0.5, and r0.5.repeat2 for its second measurement."""
    key = f"c{int(level)}" if plan.mode is Mode.CLOSED else "r" + re.sub(r"[^0-9.]", "_", f"{level:g}")
    return key if repeat <= 1 else f"{key}.repeat{repeat}"


def repeat_plan(plan: SweepPlan, repeat: int) -> SweepPlan:
    """The plan of a level's `repeat`-th measurement: the same load with a fresh seed (other
    arrival times and prompts), so repeats sample the arrival-sequence chance one level cannot."""
    if repeat <= 1:
        return plan
    return replace(plan, seed=zlib.crc32(f"{plan.seed}/repeat {repeat}".encode()))


def parse_levels(text: str, what: str) -> tuple[float, ...]:
    """"1,2,4,8" -> (1.0, 2.0, 4.0, 8.0); one-line error naming the flag otherwise."""
    try:
        values = tuple(float(x) for x in str(text).split(",") if x.strip())
    except ValueError:
        raise UserError(f"{what}: cannot read {text!r} (want numbers separated by commas, e.g. 1,2,4,8)") \
            from None
    if not values:
        raise UserError(f"{what}: give at least one level")
    if not all(0 < value < math.inf for value in values):
        raise UserError(f"{what}: every level must be positive, got {text!r}")
    return values


def parse_slo_overrides(items: list[str]) -> dict[str, float]:
    """["ttft:2500", "tpot:50"] -> {"ttft": 2500.0, "tpot": 50.0} (milliseconds, like vllm bench)."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or name not in SLO_KINDS or not (number > 0 and math.isfinite(number)):
            raise UserError(f"--slo {item!r}: want NAME:MS with NAME one of {', '.join(SLO_KINDS)} "
                            "and a positive number of milliseconds")
        out[name] = number
    return out
