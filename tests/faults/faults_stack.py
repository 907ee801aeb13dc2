"""A real Prometheus and a real Alertmanager for the fault tests, each on a free loopback port with
a temporary folder, always stopped at the end of the `with` block (failures included).

Alertmanager runs with clustering off (`--cluster.listen-address=`): its default gossip port 9094
would collide between tests running at the same time.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crossover.netutil import free_port
from tests.helpers import require_binary


@dataclass
class Daemon:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def get_json(self, path: str, params: dict[str, str] | None = None) -> Any:
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(self.url + path + query, timeout=10) as response:
            return json.loads(response.read())

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str, poll: float = 0.25) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if self.process.poll() is not None:
                raise AssertionError(f"{self.url} exited ({self.process.returncode}) waiting for {what}: "
                                     f"{self.tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {timeout:g} s ({self.url}); log: {self.tail()}")
            time.sleep(poll)


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def _daemon(argv: list[str], port: int, folder: Path, name: str) -> Iterator[Daemon]:
    log = folder / f"{name}.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    daemon = Daemon(f"http://127.0.0.1:{port}", process, log)
    try:
        daemon.wait_until(lambda: _ready(daemon.url), 60, f"{name} ready")
        yield daemon
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@contextmanager
def running_prometheus(config: Path) -> Iterator[Daemon]:
    binary = require_binary("prometheus")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="faults-prom-") as folder, _daemon(
            [binary, f"--config.file={config}", f"--storage.tsdb.path={folder}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            port, Path(folder), "prometheus") as daemon:
        yield daemon


@contextmanager
def running_alertmanager(config: Path, port: int | None = None) -> Iterator[Daemon]:
    binary = require_binary("prometheus-alertmanager")
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="faults-am-") as folder, _daemon(
            [binary, f"--config.file={config}", f"--storage.path={folder}/data",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"],
            port, Path(folder), "alertmanager") as daemon:
        yield daemon


def alertmanager_config(webhook_url: str, group_by: list[str]) -> dict[str, Any]:
    """Every alert to one webhook, fast: group_wait/group_interval of a second, resolved sent."""
    return {
        "route": {"receiver": "webhook", "group_by": group_by, "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1m"},
        "receivers": [{"name": "webhook",
                       "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
