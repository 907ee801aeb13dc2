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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from crossover.processes import die_with_parent, stop_group
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
                               preexec_fn=die_with_parent, cwd=folder)
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


def emitted_by_id(spec: FleetSpec, topology: str | None = None) -> dict[str, dict[str, Any]]:
    """What the simulators of `topology` (of every topology when None) wrote, by completion id."""
    chosen = spec.topologies if topology is None else [spec.topology(topology)]
    return {r["id"]: r for t in chosen for i in t.instances for r in emitted(i.url)}


@dataclass
class StampErrors:
    """The client's token stamps against the times the simulator wrote the tokens, over the requests
    matched by completion id that finished with as many token events as the simulator wrote."""

    events: int  # token events the client recorded, over every request
    first: np.ndarray  # per matched request: its first stamp minus the first write, seconds
    itl: np.ndarray  # per gap of a matched request: the stamps' gap minus the writes' gap
    matched: pd.DataFrame  # the matched requests' rows


def stamp_errors(requests: pd.DataFrame, served: Mapping[str, dict[str, Any]]) -> StampErrors:
    """The sweep's `requests` against `served` (emitted_by_id)."""
    first: list[float] = []
    itl: list[float] = []
    rows: list[Any] = []
    for label, row in requests.iterrows():
        record = served.get(row["completion_id"])
        stamped = row["send_time"] + np.asarray(row["chunk_times"])
        if not row["ok"] or record is None or len(stamped) != len(record["token_times"]):
            continue
        written = np.asarray(record["token_times"])
        first.append(stamped[0] - written[0])
        itl.extend(np.diff(stamped) - np.diff(written))
        rows.append(label)
    events = int(requests["chunk_times"].map(len).sum()) if len(requests) else 0
    return StampErrors(events, np.asarray(first), np.asarray(itl), requests.loc[rows])
