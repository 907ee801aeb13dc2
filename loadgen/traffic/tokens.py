"""The model's tokenizer, as the sweep uses it to make prompts of exact lengths.

Two sources, one interface: the server's own `POST /tokenize` and `POST /detokenize` (vLLM's API
server has both, and so does the simulator), or a local tokenizer folder (`--tokenizer DIR`:
tokenizer.json read with `tokenizers`, and the chat template of tokenizer_config.json rendered with
jinja2 as transformers and vLLM render it), never a download. Every failure to get one is a
`UserError` raised before any traffic.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

from crossover.errors import UserError

Messages = list[dict[str, Any]]
_TIMEOUT_S = 30.0


class Tokenizer(Protocol):
    """What the sweep needs of a tokenizer; `source` names it in messages and in workload.json."""

    source: str
    max_model_len: int | None

    def encode(self, text: str, special: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def encode_chat(self, messages: Messages) -> list[int] | None:
        """The prompt ids of a chat request (template applied), or None when unknown."""

    def close(self) -> None:
        """Let go of any connection (it is opened again when needed)."""


class ServerTokenizer:
    """A vLLM API server's /tokenize and /detokenize over one kept-alive connection."""

    def __init__(self, url: str, model: str) -> None:
        parts = urlsplit(url)
        self.url, self.model = url.rstrip("/"), model
        self.source = f"{self.url}/tokenize"
        secure = parts.scheme == "https"
        connection = http.client.HTTPSConnection if secure else http.client.HTTPConnection
        self._connection = connection(parts.hostname or "127.0.0.1", parts.port or (443 if secure else 80),
                                      timeout=_TIMEOUT_S)
        self._prefix = parts.path.rstrip("/")
        probe = self._post("/tokenize", {"model": model, "prompt": "hello", "add_special_tokens": False})
        limit = probe.get("max_model_len")
        self.max_model_len = limit if isinstance(limit, int) else None

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        try:
            self._connection.request("POST", self._prefix + path, body=data,
                                     headers={"Content-Type": "application/json"})
            response = self._connection.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self._connection.close()
            raise UserError(f"{self.url}{path}: cannot reach the server ({exc})") from None
        if response.status == 404:
            raise UserError(f"{self.url}: the server has no {path} endpoint (give a local --tokenizer DIR)")
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = None
        if response.status != 200 or not isinstance(answer, dict):
            detail = " ".join(payload.decode(errors="replace").split())[:200]
            raise UserError(f"{self.url}{path}: HTTP {response.status}: {detail}")
        return answer

    def _ids(self, answer: dict[str, Any], path: str) -> list[int]:
        ids = answer.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise UserError(f"{self.url}{path}: the answer has no token list")
        return ids

    def encode(self, text: str, special: bool = False) -> list[int]:
        answer = self._post("/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": special})
        return self._ids(answer, "/tokenize")

    def decode(self, ids: Sequence[int]) -> str:
        answer = self._post("/detokenize", {"model": self.model, "tokens": list(ids)})
        text = answer.get("prompt")
        if not isinstance(text, str):
            raise UserError(f"{self.url}/detokenize: the answer has no prompt text")
        return text

    def encode_chat(self, messages: Messages) -> list[int] | None:
        answer = self._post("/tokenize", {"model": self.model, "messages": messages,
                                          "add_generation_prompt": True})
        return self._ids(answer, "/tokenize")

    def close(self) -> None:
        self._connection.close()


class LocalTokenizer:
    """A tokenizer folder (tokenizer.json, and tokenizer_config.json for the chat template)."""

    def __init__(self, directory: str | Path) -> None:
        folder = Path(directory)
        self.source = str(folder)
        if not (folder / "tokenizer.json").is_file():
            raise UserError(f"--tokenizer {folder}: no tokenizer.json there")
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise UserError("--tokenizer needs the `tokenizers` package (pip install tokenizers)") from None
        try:
            self._tokenizer = HFTokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the library raises its own Exception subclasses for bad files
            raise UserError(f"--tokenizer {folder}: tokenizer.json does not load ({exc})") from None
        config = _read_config(folder)
        limit = config.get("model_max_length")
        self.max_model_len = limit if isinstance(limit, int) and limit < 10**9 else None
        self._chat = _chat_template(folder, config)
        self._special = {name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")}

    def encode(self, text: str, special: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=special).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def encode_chat(self, messages: Messages) -> list[int] | None:
        if self._chat is None:
            return None
        # as transformers' apply_chat_template: the template writes any BOS itself
        text = self._chat.render(messages=messages, add_generation_prompt=True, **self._special)
        return self.encode(text)

    def close(self) -> None:
        pass


def _read_config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.exists():
        return {}
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--tokenizer {folder}: tokenizer_config.json does not load ({exc})") from None
    return config if isinstance(config, dict) else {}


def _token_text(token: Any) -> str:
    if isinstance(token, dict):  # {"content": "<s>", ...} in newer tokenizer_config.json files
        return str(token.get("content", ""))
    return "" if token is None else str(token)


def _chat_template(folder: Path, config: dict[str, Any]) -> Any:
    """The chat template, compiled as transformers compiles it (sandboxed, trimmed blocks)."""
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: the default one
        template = next((t.get("template") for t in template if isinstance(t, dict)
                         and t.get("name") == "default"), None)
    if not isinstance(template, str):
        return None
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        return ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(template)
    except TemplateError as exc:
        raise UserError(f"--tokenizer {folder}: the chat template does not compile ({exc})") from None


def open_tokenizer(directory: str | None, urls: Sequence[str],
                   model: str) -> ServerTokenizer | LocalTokenizer:
    """The local folder when given; otherwise the first of `urls` whose server answers /tokenize."""
    if directory:
        return LocalTokenizer(directory)
    problems = []
    for url in dict.fromkeys(urls):
        try:
            return ServerTokenizer(url, model)
        except UserError as exc:
            problems.append(str(exc))
    raise UserError(problems[0] if len(problems) == 1 else
                    f"no server answers /tokenize ({'; '.join(problems[:2])}); give a local --tokenizer DIR")
