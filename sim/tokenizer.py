"""The simulator's tokenizer: one whitespace word is one token, and a chat message adds a fixed
template overhead. `/tokenize`, `/detokenize` and the prompt counting of `/v1/completions` and
`/v1/chat/completions` all go through here, so what a client learns from `/tokenize` is what the
simulator counts.

Token id i reads back as the word `w{i}`; any other word maps to a stable id by its CRC-32.
"""

from __future__ import annotations

import re
import zlib
from typing import Any

VOCAB_SIZE = 32_000
_TEMPLATE_IDS = (1, 2, 3, 4)  # template tokens around each chat message (role markers, separators)
MESSAGE_OVERHEAD = len(_TEMPLATE_IDS)
_ID_WORD = re.compile(r"w(\d{1,5})")


class TokenizeError(ValueError):
    """A request the OpenAI API would answer with 400; the message names the field."""


def word_id(word: str) -> int:
    match = _ID_WORD.fullmatch(word)
    if match and int(match.group(1)) < VOCAB_SIZE:
        return int(match.group(1))
    return zlib.crc32(word.encode()) % VOCAB_SIZE


def encode(text: str) -> list[int]:
    return [word_id(word) for word in text.split()]


def decode(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


def message_text(message: Any) -> str:
    if not isinstance(message, dict):
        raise TokenizeError("each message must be an object with role and content")
    content = message.get("content") or ""
    if isinstance(content, list):  # content parts
        content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def encode_chat(messages: Any) -> list[int]:
    """The prompt ids of a conversation: each message's words plus MESSAGE_OVERHEAD template ids."""
    if not isinstance(messages, list) or not messages:
        raise TokenizeError("messages must be a non-empty list")
    ids: list[int] = []
    for message in messages:
        ids.extend(_TEMPLATE_IDS)
        ids.extend(encode(message_text(message)))
    return ids


def encode_prompt(prompt: Any) -> list[int]:
    """A completion prompt's ids: a text's words, or a token-id list as given."""
    if isinstance(prompt, str):
        return encode(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   for t in prompt):
        if not all(0 <= t < VOCAB_SIZE for t in prompt):
            raise TokenizeError(f"prompt token ids must be in [0, {VOCAB_SIZE})")
        return list(prompt)
    if isinstance(prompt, list) and len(prompt) == 1:
        return encode_prompt(prompt[0])
    raise TokenizeError("prompt must be a string or a list of token ids (batched prompts are not simulated)")
