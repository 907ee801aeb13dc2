"""Seeded requests of exact token lengths: the same prompts, lengths and arrival times for every
topology at a level.

Lengths are counted by the model's own tokenizer (loadgen/traffic/tokens.py), so a planned input of N
tokens is N tokens on any model, not N words. Random prompts on `/v1/completions` are token-id
lists drawn from the ids of an ordinary English text (exact by construction); random chat prompts
are such ids decoded to text and re-encoded until the text is exactly N tokens; the chat template's
fixed overhead is measured once per run and planned for. Datasets (JSONL, ShareGPT) are sampled
with the seed and counted with the same tokenizer. Random tokens per request keep prefix caching
out of the picture, except for the shared prefix.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from crossover.errors import UserError
from crossover.loadgen.plan import Arrival, DatasetKind, Endpoint, LengthDist, LengthKind, SweepPlan
from crossover.loadgen.traffic.tokens import Messages, Tokenizer

_BLOCK = 256  # requests drawn per block; the sequence does not depend on how many are consumed
_FIT_ROUNDS = 8
# The pool of random prompt tokens: the ids of ordinary text, so they are no special or control
# tokens, whatever the vocabulary.
POOL_TEXT = (
    "the model serves tokens in steps of a batch and each one is streamed back to the client while the "
    "scheduler keeps the cache full of blocks that other requests may share when their prompts begin "
    "with the same words so a platform engineer who plans capacity for a fleet of replicas measures "
    "latency throughput and goodput under load before choosing between one large server and several "
    "small ones or a split of prefill from decode across machines with fast links between them where "
    "memory bandwidth compute time network delay queue length and batch size all change the answer "
    "people ask questions about history science music travel cooking weather sport money health and "
    "language every day and expect short clear useful replies written in plain words without delay"
)
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
          "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system"}


@dataclass(frozen=True)
class FollowUp:
    """A later turn of a conversation, prepared with the first: its new user message and the
    answer's planned length (its history is known only once the earlier turns are answered)."""

    text: str
    tokens: int  # the message's content tokens
    output_len: int

    def input_after(self, input_tokens: int, output_tokens: int, turn_tokens: int) -> int:
        """This turn's prompt tokens after a turn of `input_tokens` and `output_tokens`: that turn's
        prompt, its answer, this message and the template tokens a turn adds (Workload.turn_tokens)."""
        return input_tokens + output_tokens + self.tokens + turn_tokens


@dataclass(frozen=True)
class SyntheticRequest:
    index: int  # position in the level's sequence; identical across topologies
    prompt: str | list[int]  # text, or token ids (random prompts on /v1/completions)
    input_len: int  # prompt tokens the server should count (template overhead included)
    output_len: int
    messages: Messages | None = None  # the chat request's messages (chat endpoint)
    source: str = ""  # where a dataset prompt came from (FILE:LINE), for error messages
    followups: tuple[FollowUp, ...] = ()  # a conversation's later turns (--turns)


@dataclass
class _Entry:
    """One dataset prompt before counting: text or messages, and the answer's length if known."""

    where: str
    prompt: str | None
    messages: Messages | None
    output_len: int | None = None
    reply: str | None = None  # ShareGPT: the recorded answer, counted for output_len
    later: list[tuple[str, str | None]] = field(default_factory=list)  # ShareGPT: next (user, answer) turns


@dataclass
class Workload:
    """What the sweep prepares once per run: the tokenizer, the random-token pool, the chat
    template's overhead and the dataset's entries (counted as they are first sampled)."""

    plan: SweepPlan
    tokenizer: Tokenizer
    max_model_len: int
    pool: np.ndarray
    template_tokens: int = 0
    turn_tokens: int = 0  # template tokens a later turn adds besides its contents (answer + user message)
    entries: list[_Entry] = field(default_factory=list)
    _counted: dict[int, tuple[int, int | None]] = field(default_factory=dict, repr=False)

    def describe(self) -> dict[str, Any]:
        return {"tokenizer": self.tokenizer.source, "endpoint": self.plan.endpoint.value,
                "dataset": self.plan.dataset.value, "dataset_path": self.plan.dataset_path,
                "dataset_entries": len(self.entries), "chat_template_tokens": self.template_tokens,
                "turns": self.plan.turns, "turn_template_tokens": self.turn_tokens,
                "max_model_len": self.max_model_len}


def prepare_workload(plan: SweepPlan, tokenizer: Tokenizer, max_model_len: int) -> Workload:
    """Read the dataset, draw the token pool and measure the chat template, before any traffic."""
    limit = tokenizer.max_model_len or max_model_len
    pool = np.unique(np.asarray(tokenizer.encode(POOL_TEXT), dtype=np.int64))
    if pool.size < 8:
        raise UserError(f"tokenizer {tokenizer.source}: encodes ordinary text to only {pool.size} distinct "
                        "tokens; is it the model's tokenizer?")
    workload = Workload(plan, tokenizer, limit, pool)
    if plan.endpoint is Endpoint.CHAT:
        workload.template_tokens = _template_overhead(tokenizer)
        if plan.turns > 1:
            workload.turn_tokens = _turn_overhead(tokenizer) - workload.template_tokens
    if plan.dataset is DatasetKind.RANDOM:
        # the last turn of a conversation holds every earlier message and answer
        high = (plan.turns * (plan.input_len.high + plan.output_len.high) + workload.template_tokens
                + (plan.turns - 1) * workload.turn_tokens)
        if high > limit:
            turns = f" over {plan.turns} turns" if plan.turns > 1 else ""
            raise UserError(f"--input-len {plan.input_len.describe()} plus --output-len "
                            f"{plan.output_len.describe()}{turns} reaches {high} tokens, more than the "
                            f"model's context of {limit}")
    else:
        assert plan.dataset_path is not None
        workload.entries = read_dataset(plan.dataset, plan.dataset_path, plan.endpoint)
    return workload


def most_turns(workload: Workload) -> int:
    """The most requests one of the dataset's conversations makes with the plan's endpoint (a
    ShareGPT conversation's user turns on chat; one on completions, which sends the first turn)."""
    return max((1 + len(entry.later) for entry in workload.entries), default=1)


def with_turns(workload: Workload, turns: int) -> Workload:
    """The prepared workload sending `turns` requests per conversation (--turns), its later turns'
    template tokens measured as prepare_workload measures them."""
    plan = replace(workload.plan, turns=turns)
    turn_tokens = (_turn_overhead(workload.tokenizer) - workload.template_tokens
                   if plan.endpoint is Endpoint.CHAT and turns > 1 else 0)
    return replace(workload, plan=plan, turn_tokens=turn_tokens)


def _template_overhead(tokenizer: Tokenizer) -> int:
    sample = "how many tokens does the template add"
    with_template = tokenizer.encode_chat([{"role": "user", "content": sample}])
    if with_template is None:
        raise UserError(f"--endpoint chat: tokenizer {tokenizer.source} has no chat template "
                        "(chat_template in tokenizer_config.json)")
    return len(with_template) - len(tokenizer.encode(sample))


def _turn_overhead(tokenizer: Tokenizer) -> int:
    """Template tokens of a three-message conversation (user, assistant, user) besides contents."""
    texts = ("how many tokens does the template add", "a few", "and for one more turn")
    messages = [{"role": role, "content": text} for role, text in zip(("user", "assistant", "user"), texts,
                                                                        strict=True)]
    ids = tokenizer.encode_chat(messages) or []
    return len(ids) - sum(len(tokenizer.encode(text)) for text in texts)


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


def fit_text(tokenizer: Tokenizer, ids: list[int], n: int, pool: np.ndarray,
             rng: np.random.Generator) -> str:
    """A text that the tokenizer encodes to exactly n tokens, starting from `ids` decoded: decoding
    and re-encoding may merge or split tokens at their seams, so trim or top up and try again."""
    for _ in range(_FIT_ROUNDS):
        text = tokenizer.decode(ids)
        again = tokenizer.encode(text)
        if len(again) == n:
            return text
        ids = again[:n] if len(again) > n else again + rng.choice(pool, n - len(again)).tolist()
    raise UserError(f"tokenizer {tokenizer.source}: cannot make a text of exactly {n} tokens "
                    f"(decoding and re-encoding does not settle)")


def _random_requests(workload: Workload, level: float) -> Iterator[SyntheticRequest]:
    plan = workload.plan
    rng = _rng(plan, level, "requests")
    prefix = np.random.default_rng([plan.seed, 0xC0FFEE]).choice(workload.pool, plan.shared_prefix).tolist()
    index = 0
    while True:
        inputs = _lengths(plan.input_len, rng, _BLOCK)
        outputs = _lengths(plan.output_len, rng, _BLOCK)
        for n_in, n_out in zip(inputs.tolist(), outputs.tolist(), strict=True):
            own = max(1, n_in - plan.shared_prefix)
            ids = prefix + rng.choice(workload.pool, own).tolist()
            if plan.endpoint is Endpoint.COMPLETIONS:
                yield SyntheticRequest(index, ids, len(ids), int(n_out))
            else:
                text = fit_text(workload.tokenizer, ids, len(ids), workload.pool, rng)
                yield SyntheticRequest(index, text, len(ids) + workload.template_tokens, int(n_out),
                                       messages=[{"role": "user", "content": text}],
                                       followups=_random_followups(workload, rng))
            index += plan.turns


def _chat_messages(entry: _Entry) -> Messages:
    return entry.messages or [{"role": "user", "content": entry.prompt}]


def _random_followups(workload: Workload, rng: np.random.Generator) -> tuple[FollowUp, ...]:
    plan = workload.plan
    later = []
    for n_in, n_out in zip(_lengths(plan.input_len, rng, plan.turns - 1).tolist(),
                           _lengths(plan.output_len, rng, plan.turns - 1).tolist(), strict=True):
        ids = rng.choice(workload.pool, n_in).tolist()
        text = fit_text(workload.tokenizer, ids, n_in, workload.pool, rng)
        later.append(FollowUp(text, n_in, n_out))
    return tuple(later)


def _count(workload: Workload, position: int) -> tuple[int, int | None]:
    """An entry's prompt tokens as the server will count them, and its answer's tokens if recorded."""
    known = workload._counted.get(position)
    if known is not None:
        return known
    entry = workload.entries[position]
    tokenizer = workload.tokenizer
    if workload.plan.endpoint is Endpoint.CHAT:
        ids = tokenizer.encode_chat(_chat_messages(entry))
        if ids is None:  # prepare_workload measured a template, so this does not happen
            raise UserError(f"{entry.where}: the tokenizer cannot apply a chat template")
        n_in = len(ids)
    else:
        assert entry.prompt is not None
        n_in = len(tokenizer.encode(entry.prompt, special=True))
    n_out = entry.output_len
    if n_out is None and entry.reply is not None:
        n_out = max(1, len(tokenizer.encode(entry.reply)))
    workload._counted[position] = (n_in, n_out)
    return n_in, n_out


def _dataset_followups(workload: Workload, entry: _Entry, drawn: int) -> tuple[FollowUp, ...]:
    """A ShareGPT conversation's later user turns, up to --turns, with their answers' lengths."""
    later = []
    for text, reply in entry.later[:workload.plan.turns - 1]:
        answer = len(workload.tokenizer.encode(reply)) if reply else drawn
        later.append(FollowUp(text, len(workload.tokenizer.encode(text)), max(1, answer)))
    return tuple(later)


def _dataset_requests(workload: Workload, level: float) -> Iterator[SyntheticRequest]:
    plan = workload.plan
    rng = _rng(plan, level, "requests")
    index = 0
    while True:  # a seeded order over the whole dataset, reshuffled each pass
        order = rng.permutation(len(workload.entries)).tolist()
        outputs = _lengths(plan.output_len, rng, len(order)).tolist()
        for position, drawn in zip(order, outputs, strict=True):
            entry = workload.entries[position]
            n_in, n_out = _count(workload, position)
            n_out = n_out or int(drawn)
            if n_in + n_out > workload.max_model_len:
                raise UserError(f"{entry.where}: a prompt of {n_in} tokens and {n_out} output tokens "
                                f"exceeds the model's context of {workload.max_model_len}")
            if plan.endpoint is Endpoint.CHAT:
                messages = _chat_messages(entry)
                text = str(messages[-1]["content"])
                yield SyntheticRequest(index, text, n_in, n_out, messages, entry.where,
                                       _dataset_followups(workload, entry, int(drawn)))
            else:
                assert entry.prompt is not None
                yield SyntheticRequest(index, entry.prompt, n_in, n_out, source=entry.where)
            index += plan.turns


def requests(workload: Workload, level: float) -> Iterator[SyntheticRequest]:
    """The level's endless, deterministic request sequence (take as many as the level needs)."""
    if workload.plan.dataset is DatasetKind.RANDOM:
        return _random_requests(workload, level)
    return _dataset_requests(workload, level)


# --- reading datasets -------------------------------------------------------------------------

def _messages(raw: Any, where: str, *, roles: dict[str, str] | None = None) -> Messages:
    """Chat messages checked: a non-empty list of {role, content} with at least one user turn."""
    if not isinstance(raw, list) or not raw:
        raise UserError(f"{where}: messages must be a non-empty list")
    out: Messages = []
    for number, message in enumerate(raw):
        if not isinstance(message, dict):
            raise UserError(f"{where}: message {number} is not an object")
        role = message.get("role", message.get("from"))
        content = message.get("content", message.get("value"))
        if roles is not None:
            role = roles.get(str(role).lower())
        if role not in ("system", "user", "assistant") or not isinstance(content, str):
            raise UserError(f"{where}: message {number} needs a role (system, user or assistant) "
                            "and a text content")
        out.append({"role": role, "content": content})
    if not any(m["role"] == "user" for m in out):
        raise UserError(f"{where}: the conversation has no user turn")
    return out


def _output_len(raw: Any, where: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise UserError(f"{where}: output_len must be a positive integer, got {raw!r}")
    return raw


def _read_jsonl(path: Path, endpoint: Endpoint) -> list[_Entry]:
    entries = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            where = f"{path}:{number}"
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise UserError(f"{where}: not JSON ({exc.args[0] if exc.args else exc})") from None
            if not isinstance(item, dict):
                raise UserError(f"{where}: want a JSON object with prompt or messages")
            output_len = _output_len(item.get("output_len"), where)
            if "messages" in item:
                if endpoint is Endpoint.COMPLETIONS:
                    raise UserError(f"{where}: has messages; send it with --endpoint chat")
                entries.append(_Entry(where, None, _messages(item["messages"], where), output_len))
            elif isinstance(item.get("prompt"), str) and item["prompt"].strip():
                entries.append(_Entry(where, item["prompt"], None, output_len))
            else:
                raise UserError(f"{where}: want a non-empty prompt (text) or messages")
    return entries


def _read_sharegpt(path: Path, endpoint: Endpoint) -> list[_Entry]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise UserError(f"{path}: not a ShareGPT JSON file ({exc})") from None
    if not isinstance(data, list):
        raise UserError(f"{path}: a ShareGPT file is a JSON list of conversations")
    entries = []
    for number, item in enumerate(data):
        name = item.get("id", number) if isinstance(item, dict) else number
        where = f"{path}: conversation {name}"
        turns = item.get("conversations") if isinstance(item, dict) else None
        messages = _messages(turns, where, roles=_ROLES)
        first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
        reply = next((m["content"] for m in messages[first_user + 1:] if m["role"] == "assistant"), None)
        asked = messages[:first_user + 1]
        later = _later_turns(messages[first_user + 1:])
        if endpoint is Endpoint.COMPLETIONS:
            entries.append(_Entry(where, asked[-1]["content"], None, reply=reply))
        else:
            entries.append(_Entry(where, None, asked, reply=reply, later=later))
    return entries


def _later_turns(rest: Messages) -> list[tuple[str, str | None]]:
    """(user message, the answer after it) for each user turn after the first."""
    turns = []
    for i, message in enumerate(rest):
        if message["role"] == "user":
            answer = next((m["content"] for m in rest[i + 1:] if m["role"] == "assistant"), None)
            turns.append((str(message["content"]), answer))
    return turns


def read_dataset(kind: DatasetKind, path_text: str, endpoint: Endpoint) -> list[_Entry]:
    """Every entry of a JSONL or ShareGPT file, checked; one-line errors name the file and line."""
    path = Path(path_text)
    try:
        entries = _read_jsonl(path, endpoint) if kind is DatasetKind.JSONL else _read_sharegpt(path, endpoint)
    except OSError as exc:
        raise UserError(f"--dataset-path {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise UserError(f"--dataset-path {path}: not UTF-8 text") from None
    if not entries:
        raise UserError(f"--dataset-path {path}: holds no prompts")
    return entries


def arrival_offsets(plan: SweepPlan, rate: float, n: int) -> np.ndarray:
    """Send times (seconds from the level's start) of n open-loop requests at `rate` req/s.

    Gaps are gamma(shape=burstiness, mean 1) in units of the cumulative arrival intensity, so
    burstiness 1 is Poisson (as in `vllm bench serve`). One draw per level, or with
    plan.shared_arrivals one for every level (the rate-1 level's, scaled). With a ramp the intensity
    rises linearly from 0 to `rate` over ramp_s: the unit-rate times are mapped through the inverse of
    Lambda(t) = rate t^2 / (2 ramp) (t < ramp), rate ramp / 2 + rate (t - ramp) after.
    """
    rng = _rng(plan, 1.0 if plan.shared_arrivals else rate, "arrivals")
    shape = 1.0 if plan.arrival is Arrival.POISSON else plan.burstiness
    gaps = rng.gamma(shape, 1.0 / shape, size=n)
    units = np.cumsum(gaps) - gaps[0]  # the first request goes at once
    if plan.ramp_s <= 0:
        return units / rate
    knee = rate * plan.ramp_s / 2
    return np.where(units < knee, np.sqrt(2 * plan.ramp_s * units / rate),
                    plan.ramp_s + (units - knee) / rate)
