"""Helpers for tests: finding external tools (missing: a skip locally, a failure under CI=true)."""

from __future__ import annotations

import bisect
import math
import os
import shutil
import threading
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
# The folders pyproject.toml maps into the crossover namespace (subpackage -> folder): what a wheel ships.
PACKAGE_DIR: dict[str, str] = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]
PACKAGE_DIRS = sorted(set(PACKAGE_DIR.values()))
SPECS = REPO / "compose" / "specs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_binary(name: str) -> str:
    """Path of an external program; a skip when it is missing (tests/ci_guard.py fails it under CI=true)."""
    path = shutil.which(name)
    require(path is not None, f"{name} is not installed (run `make test`, which installs it)")
    assert path is not None
    return path


def require(condition: bool, message: str) -> None:
    """A skip when a dependency of a test is missing; tests/ci_guard.py turns it into a failure under
    CI=true, as it does every other skip."""
    if not condition:
        pytest.skip(message)


def wait_for(check: Callable[[], T], timeout: float, what: str, poll: float = 0.2,
             retry_on: tuple[type[Exception], ...] = (OSError,)) -> T:
    """Call check() every `poll` seconds until it returns something truthy, and return that. An
    error of a type in `retry_on` (a server not up yet) counts as not yet; at the timeout, an
    AssertionError names `what` and the last value or error."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = check()
        except retry_on as exc:
            last: object = exc
        else:
            if value:
                return value
            last = value
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what} (last: {last!r})")
        time.sleep(poll)


def word_tokenizer(folder: Path) -> str:
    """A local tokenizer (one whitespace word, one token) that counts like the simulator and the
    loopback test servers, for sweeps against servers without /tokenize (--tokenizer DIR)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from crossover.loadgen.traffic.dataset import POOL_TEXT

    words = ["<unk>", *dict.fromkeys(POOL_TEXT.split()), *(f"w{i}" for i in range(509))]
    tokenizer = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return str(folder)


def bucket_width(value: float, buckets: tuple[float, ...]) -> float:
    """The width of the histogram bucket holding `value` (infinite above the last boundary)."""
    index = bisect.bisect_left(buckets, value)
    if index == len(buckets):
        return math.inf
    return buckets[index] - (buckets[index - 1] if index else 0.0)


def client_quantile(values: list[float], q: float) -> float:
    """The client's q quantile: the smallest value with at least q of the values at or below it."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def agree_within_bucket(server: float, client: float, buckets: tuple[float, ...]) -> bool:
    """A server figure from a histogram agrees with the client's exact one when it is off by less
    than the width of the bucket the client's value falls in (the histogram's resolution there).
    Above the last boundary the histogram says nothing: a test that gets there must fail."""
    assert client < buckets[-1], f"the client's {client} is past the last bucket ({buckets[-1]})"
    return abs(server - client) < bucket_width(client, buckets)


@contextmanager
def serving_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A threaded HTTP server of `handler` on a loopback port the OS picks as it binds, as host:port;
    shut down on exit."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
