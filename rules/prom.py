"""A real Prometheus (and Alertmanager) on loopback, started and stopped by the caller: for the
demo, live tests and checks.

`running_prometheus(config)` starts the `prometheus` binary on a free loopback port with a
temporary storage folder and stops it on exit; `PrometheusServer.query(expr)` runs an instant query.
`running_alertmanager(config)` does the same for Alertmanager.
"""

from __future__ import annotations

import json
import shutil
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
from typing import Any, TypeVar

from crossover.errors import UserError
from crossover.netutil import free_port
from crossover.processes import die_with_parent, stop_group

D = TypeVar("D", bound="Daemon")


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass
class Daemon:
    """A server of the Prometheus family (Prometheus, Alertmanager) started by `running_daemon`."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def get_json(self, path: str, params: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
        """The decoded JSON body of a GET, whatever its status field says."""
        query = "?" + urllib.parse.urlencode(params) if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=timeout) as response:
            return json.loads(response.read())

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str, poll: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if check():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}: {what} not reached within {timeout:g}s; "
                                   f"log: {self.tail(2000)}")
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.url} exited ({self.process.returncode}) waiting for {what}: "
                                   f"{self.tail(2000)}")
            time.sleep(poll)


@dataclass
class PrometheusServer(Daemon):
    def _get(self, path: str, params: dict[str, str], timeout: float = 10.0) -> Any:
        body = self.get_json(path, params, timeout)
        if body.get("status") != "success":
            raise RuntimeError(f"Prometheus {path}: {body}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """Instant query (now, or at a Unix time); a vector as samples (NaN kept: it is data too)."""
        params = {"query": expr} | ({"time": repr(at)} if at is not None else {})
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            return [Sample({}, float(data["result"][1]))]
        return [Sample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def query_range_vector(self, expr: str,
                           at: float) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
        """A range-vector selector (`name{...}[1m]`) at a Unix time: each series' raw samples."""
        data = self._get("/api/v1/query", {"query": expr, "time": repr(at)})
        return [(r["metric"], [(float(t), float(v)) for t, v in r["values"]]) for r in data["result"]]

    def targets_up(self) -> dict[str, str]:
        data = self._get("/api/v1/targets", {"state": "active"})
        return {t["scrapeUrl"]: t["health"] for t in data["activeTargets"]}

    def rule_health(self) -> dict[str, str]:
        """Recording/alerting rule name -> health ("ok", "err", "unknown"), with the error text."""
        data = self._get("/api/v1/rules", {})
        out: dict[str, str] = {}
        for group in data["groups"]:
            for rule in group["rules"]:
                error = f": {rule['lastError']}" if rule.get("lastError") else ""
                out[rule["name"]] = rule["health"] + error
        return out

    def alerts(self) -> list[dict[str, Any]]:
        return list(self._get("/api/v1/alerts", {})["alerts"])


def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise UserError("prometheus is not installed (apt-get install prometheus)")
    return path


def alertmanager_binary() -> str:
    """Debian names it prometheus-alertmanager; upstream tarballs name it alertmanager."""
    path = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if path is None:
        raise UserError("alertmanager is not installed (apt-get install prometheus-alertmanager)")
    return path


@contextmanager
def running_daemon(server: type[D], argv: list[str], port: int, log: Path,
                   start_timeout: float) -> Iterator[D]:
    """Run argv (which listens on 127.0.0.1:port) until it answers /-/ready; always stopped on exit."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True, preexec_fn=die_with_parent)
    daemon = server(f"http://127.0.0.1:{port}", process, log)
    try:
        daemon.wait_until(lambda: _ready(daemon.url), start_timeout, "/-/ready")
        yield daemon
    finally:
        stop_group(process)


@contextmanager
def running_prometheus(config: Path, start_timeout: float = 30.0) -> Iterator[PrometheusServer]:
    """Start Prometheus with `config` on 127.0.0.1:<free port>; always stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="crossover-prom-") as storage:
        port = free_port()
        argv = [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={storage}/data",
                f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle", "--log.level=warn"]
        with running_daemon(PrometheusServer, argv, port, Path(storage) / "prometheus.log",
                            start_timeout) as server:
            yield server


@contextmanager
def running_alertmanager(config: Path, port: int | None = None,
                         start_timeout: float = 60.0) -> Iterator[Daemon]:
    """Start Alertmanager with `config` on 127.0.0.1:<port or a free one>, clustering off (its
    default gossip port 9094 would collide between servers started at the same time)."""
    with tempfile.TemporaryDirectory(prefix="crossover-am-") as storage:
        port = port or free_port()
        argv = [alertmanager_binary(), f"--config.file={config}", f"--storage.path={storage}/data",
                f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=", "--log.level=warn"]
        with running_daemon(Daemon, argv, port, Path(storage) / "alertmanager.log", start_timeout) as server:
            yield server


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/-/ready", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
