"""The simulator in its own process (`crossover sim`), so that it and the load generator each have
a core and a GIL: timing checks then measure the client, not the two sharing one interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from crossover.processes import stop_group
from crossover.spec import FleetSpec


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def sim_process(spec: FleetSpec, folder: Path, time_scale: float = 1.0, start_timeout: float = 60.0,
                cpus: set[int] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Serve `spec` from `crossover sim` in a child process until the block ends; `cpus` pins it
    (so that a benchmark's client and simulator do not take turns on one core)."""
    spec_path = folder / "sim-spec.yaml"
    spec_path.write_text(yaml.safe_dump(spec.model_dump(mode="json")))
    log = (folder / "sim.log").open("wb")
    # `crossover sim`, through its own module only (the full CLI imports every subcommand)
    serve = ("import argparse, sys; from crossover.sim import cli; p = argparse.ArgumentParser(); "
             "cli.add_arguments(p); sys.exit(cli.run(p.parse_args(sys.argv[1:])))")
    command = [sys.executable, "-c", serve, str(spec_path), "--time-scale", str(time_scale)]
    # cwd: `python -c` puts the working folder first on sys.path; the repo's crossover/ there is
    # not the installed package (which maps sim/ and loadgen/ into it)
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                               cwd=folder)
    if cpus:
        os.sched_setaffinity(process.pid, cpus)
    try:
        urls = [i.url for t in spec.topologies for i in t.instances]
        deadline = time.monotonic() + start_timeout
        while not all(_healthy(u) for u in urls):
            if process.poll() is not None:
                raise RuntimeError(f"crossover sim exited: {(folder / 'sim.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError("crossover sim did not become healthy")
            time.sleep(0.2)
        yield process
    finally:
        stop_group(process)
        log.close()


def emitted(url: str) -> list[dict[str, Any]]:
    """The simulator's /admin/requests: each request's arrival and token write times."""
    with urllib.request.urlopen(url + "/admin/requests", timeout=30) as response:
        data: list[dict[str, Any]] = json.loads(response.read())
    return data
