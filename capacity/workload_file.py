"""`--workload FILE`: the conversations of a sweep dataset (loadgen/traffic/dataset.py's JSONL and
ShareGPT formats), read and counted by the sweep's own loader, so the ground truth runs the file's
turns and length distribution and a bad line is the loader's one-line error naming the file and line.

Tokens are counted by `--tokenizer DIR` when given, otherwise by the simulator's tokenizer (one word
one token, sim/tokenizer.py): the one the live simulator counts with, so `--validate` agrees. Each
entry keeps its prompt's prefix-cache block hashes, as the live simulator hashes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from crossover.errors import UserError
from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist, SweepPlan
from crossover.loadgen.traffic import dataset
from crossover.loadgen.traffic.tokens import LocalTokenizer, Messages
from crossover.sim import tokenizer as sim_tokenizer
from crossover.sim import truth


@dataclass(frozen=True)
class FileWorkload:
    """A workload file's conversations, and the most turns one has (the sweep's --turns for them)."""

    conversations: tuple[truth.Conversation, ...]
    turns: int


class SimTokenizer:
    """The simulator's tokenizer behind the sweep's Tokenizer interface (loadgen/traffic/tokens.py)."""

    source = "the simulator's tokenizer (one word, one token)"
    max_model_len: int | None = None

    def encode(self, text: str, special: bool = False) -> list[int]:
        return sim_tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return sim_tokenizer.decode(list(ids))

    def encode_chat(self, messages: Messages) -> list[int] | None:
        return sim_tokenizer.encode_chat(messages)

    def close(self) -> None:
        pass


def dataset_kind(path: Path, name: str | None) -> DatasetKind:
    """--dataset-name, or the file's suffix: .jsonl is JSONL, .json ShareGPT."""
    if name is not None:
        return DatasetKind(name)
    if path.suffix == ".jsonl":
        return DatasetKind.JSONL
    if path.suffix == ".json":
        return DatasetKind.SHAREGPT
    raise UserError(f"--workload {path}: name its format with --dataset-name jsonl|sharegpt "
                    "(the suffix is neither .jsonl nor .json)")


def read_conversations(path: Path, kind: DatasetKind, endpoint: Endpoint, output_len: int, max_model_len: int,
                       tokenizer_dir: str | None = None, block_size: int = 16,
                       max_turns: int | None = None) -> FileWorkload:
    """Every entry of the file as a conversation (truth.Turn each: prompt tokens, output tokens, block
    hashes). A ShareGPT conversation sent to the chat endpoint keeps all its user turns, as the sweep
    sends them with --turns (dataset.requests' follow-ups): turn k+1's prompt is the history (every
    earlier message and answer) and its new user message, counted as the sweep plans it
    (FollowUp.input_after). Every other entry is one turn: the completions endpoint sends a
    conversation's first turn, and a JSONL line's messages are one request (the sweep's JSONL has no
    turns). The hashes are the live simulator's own (sim/server.py `prompt_keys` over the messages,
    the answers as it streams them, chained per `block_size` block), so a turn finds its history in
    the prefix cache, and prompts that share a beginning (a common system prompt) hit it, as they do
    there. An entry without a recorded answer length (no output_len, no ShareGPT reply) gets
    `output_len`. `max_turns` keeps a conversation's first turns only (the sweep's --turns)."""
    from crossover.sim.server import answer_text, prompt_keys  # the server's web stack loads only for a file

    if kind is DatasetKind.RANDOM:
        raise UserError("--dataset-name: random is --input-len/--output-len; give jsonl or sharegpt")
    plan = SweepPlan(endpoint=endpoint, dataset=kind, dataset_path=str(path),
                     output_len=LengthDist.fixed(output_len))
    tokenizer = LocalTokenizer(tokenizer_dir) if tokenizer_dir else SimTokenizer()
    try:
        workload = dataset.prepare_workload(plan, tokenizer, max_model_len)
        chat = endpoint is Endpoint.CHAT
        turns = dataset.most_turns(workload) if chat and kind is DatasetKind.SHAREGPT else 1
        turns = min(turns, max_turns or turns)
        workload = dataset.with_turns(workload, turns)

        def keys(role: str, text: str) -> list[object]:
            return prompt_keys({"messages": [{"role": role, "content": text}]}, chat=True)

        # One pass of the sweep's seeded order holds every entry once, counted and checked against the
        # context by the sweep's own code; the order does not matter, the ground truth draws from it.
        out = []
        for request, _ in zip(dataset.requests(workload, 0.0), workload.entries, strict=False):
            if not chat:
                talk = truth.conversation([prompt_keys({"prompt": request.prompt}, chat=False)], [],
                                          [request.input_len], [request.output_len], block_size)
                out.append(talk)
                continue
            messages = [prompt_keys({"messages": request.messages}, chat=True)]
            prompts, outputs = [request.input_len], [request.output_len]
            for follow in request.followups:
                prompts.append(follow.input_after(prompts[-1], outputs[-1], workload.turn_tokens))
                outputs.append(follow.output_len)
                messages.append(keys("user", follow.text))
                if prompts[-1] + outputs[-1] > workload.max_model_len:
                    raise UserError(f"{request.source}: turn {len(prompts)} reaches {prompts[-1]} prompt "
                                    f"tokens (the history) and {outputs[-1]} output tokens, more than the "
                                    f"model's context of {workload.max_model_len}")
            answers = [keys("assistant", answer_text(n)) for n in outputs[:-1]]
            out.append(truth.conversation(messages, answers, prompts, outputs, block_size))
        return FileWorkload(tuple(out), turns)
    finally:
        tokenizer.close()
