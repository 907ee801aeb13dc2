"""`--workload FILE`: the prompt and output lengths of a sweep dataset (loadgen/traffic/dataset.py's
JSONL and ShareGPT formats), read and counted by the sweep's own loader, so the ground truth runs the
file's length distribution and a bad line is the loader's one-line error naming the file and line.

Tokens are counted by `--tokenizer DIR` when given, otherwise by the simulator's tokenizer (one word
one token, sim/tokenizer.py): the one the live simulator counts with, so `--validate` agrees. Each
entry keeps its prompt's prefix-cache block hashes, as the live simulator hashes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from crossover.errors import UserError
from crossover.loadgen.plan import DatasetKind, Endpoint, LengthDist, SweepPlan
from crossover.loadgen.traffic import dataset
from crossover.loadgen.traffic.tokens import LocalTokenizer, Messages
from crossover.sim import tokenizer as sim_tokenizer
from crossover.sim.scheduler import chained_block_hashes

FileRequest = tuple[int, int, tuple[int, ...]]  # prompt tokens, output tokens, prefix-cache block hashes


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


def read_lengths(path: Path, kind: DatasetKind, endpoint: Endpoint, output_len: int, max_model_len: int,
                 tokenizer_dir: str | None = None, block_size: int = 16) -> tuple[FileRequest, ...]:
    """(prompt tokens, output tokens, block hashes) of every entry of the file. The hashes are the
    live simulator's own (sim/server.py `prompt_keys`, chained per `block_size` block), so prompts
    that share a beginning (a common system prompt) hit the prefix cache as they do there. An entry without a
    recorded answer length (no output_len, no ShareGPT reply) gets `output_len`."""
    from crossover.sim.server import prompt_keys  # the server's web stack loads only for a file

    if kind is DatasetKind.RANDOM:
        raise UserError("--dataset-name: random is --input-len/--output-len; give jsonl or sharegpt")
    plan = SweepPlan(endpoint=endpoint, dataset=kind, dataset_path=str(path),
                     output_len=LengthDist.fixed(output_len))
    tokenizer = LocalTokenizer(tokenizer_dir) if tokenizer_dir else SimTokenizer()
    try:
        workload = dataset.prepare_workload(plan, tokenizer, max_model_len)
        # One pass of the sweep's seeded order holds every entry once, counted and checked against the
        # context by the sweep's own code; the order does not matter, the ground truth draws from it.
        chat = endpoint is Endpoint.CHAT
        out = []
        for request, _ in zip(dataset.requests(workload, 0.0), workload.entries, strict=False):
            body = {"messages": request.messages} if chat else {"prompt": request.prompt}
            hashes = chained_block_hashes(prompt_keys(body, chat=chat), block_size)
            out.append((request.input_len, request.output_len, hashes))
        return tuple(out)
    finally:
        tokenizer.close()
