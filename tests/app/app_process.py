"""`crossover app` as a real subprocess on a free port, for the CLI and browser tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from crossover.netutil import free_port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def running_app(spec_path: Path, results: Path, log: Path, *extra: str,
                start_timeout: float = 60.0) -> Iterator[str]:
    """Start `crossover app SPEC` on a free loopback port; yield its URL; stop it afterwards."""
    port = free_port()
    command = [sys.executable, "-m", "crossover", "app", str(spec_path), "--port", str(port),
               "--results", str(results), *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + start_timeout
            while not _healthy(url):
                if process.poll() is not None:
                    raise AssertionError(f"crossover app exited with {process.returncode}:\n"
                                         f"{log.read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"crossover app not healthy after {start_timeout} s:\n"
                                         f"{log.read_text()}")
                time.sleep(0.2)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
