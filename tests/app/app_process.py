"""`crossover app` (and the exporter) as real subprocesses on free ports, for the CLI and browser
tests. Separate processes keep their CPU work off the simulator's interpreter lock."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

from crossover.netutil import free_port


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@contextmanager
def running_crossover(args: list[str], health_path: str, log: Path,
                      start_timeout: float = 60.0) -> Iterator[str]:
    """Run `crossover ARGS --port P` until healthy at health_path; yield its URL; stop it after."""
    port = free_port()
    command = [sys.executable, "-m", "crossover", *args, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    url = f"http://127.0.0.1:{port}"
    with log.open("w") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=env)
        try:
            deadline = time.monotonic() + start_timeout
            while not _healthy(url + health_path):
                if process.poll() is not None:
                    raise AssertionError(f"crossover {args[0]} exited with {process.returncode}:\n"
                                         f"{log.read_text()}")
                if time.monotonic() > deadline:
                    raise AssertionError(f"crossover {args[0]} not healthy after {start_timeout} s:\n"
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


def running_app(spec_path: Path, results: Path, log: Path,
                *extra: str) -> AbstractContextManager[str]:
    return running_crossover(["app", str(spec_path), "--results", str(results), *extra],
                             "/_stcore/health", log)


def running_exporter_process(spec_path: Path, log: Path) -> AbstractContextManager[str]:
    return running_crossover(["exporter", str(spec_path)], "/health", log)
