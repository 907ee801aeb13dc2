"""`crossover pdproxy`: a topology's entrypoint in front of servers it does not own (the compose
`gpu-pd` profile's pd-proxy, the demo's real fleets), tested against simulated instances."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml

from crossover.netutil import free_port, spec_on_free_ports
from crossover.sim.fleet import running_fleet
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS

SEED = SPECS / "seed-70b-h100.yaml"


def pd_fleet_and_moved_entrypoint(tmp_path: Path) -> tuple[FleetSpec, int, Path]:
    """The P/D seed on free ports (what the simulator serves, its own entrypoint included), its P/D
    entrypoint's free port for ours, and a spec file naming that port (what the proxy reads)."""
    spec = spec_on_free_ports(load_spec(SPECS / "pd-8k-prompts.yaml"))
    data = spec.model_dump(mode="json")
    proxy_port = free_port()
    for topology in data["topologies"]:
        if topology["name"] == "pd1p1d":
            topology["entrypoint"]["url"] = f"http://127.0.0.1:{proxy_port}"
    path = tmp_path / "pd.yaml"
    path.write_text(yaml.safe_dump(data))
    return spec, proxy_port, path


@pytest.mark.timeout(90)
def test_pd_proxy_routes_prefill_then_decode(tmp_path: Path) -> None:
    """The compose stack's pd-proxy against simulated prefill and decode instances: the prefill gets
    the one-token request, the decode gets the whole generation, the client gets every token."""
    spec, proxy_port, proxy_spec = pd_fleet_and_moved_entrypoint(tmp_path)
    with running_fleet(spec) as fleet:
        proxy = subprocess.Popen([sys.executable, "-m", "crossover", "pdproxy", str(proxy_spec)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 stdin=subprocess.DEVNULL)
        try:
            assert proxy.stdout is not None
            assert "entrypoint of pd1p1d" in proxy.stdout.readline()
            body = {"model": spec.model.name, "prompt": " ".join(f"w{i}" for i in range(64)),
                    "max_tokens": 12, "ignore_eos": True, "stream": True}
            request = urllib.request.Request(f"http://127.0.0.1:{proxy_port}/v1/completions",
                                             data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:
                events = [line for line in response.read().decode().splitlines()
                          if line.startswith("data: {")]
            tokens = sum(1 for e in events if json.loads(e[6:])["choices"])
            assert tokens == 12
            prefill, decode = fleet.requests("prefill-0"), fleet.requests("decode-0")
            assert len(prefill) == 1 and len(prefill[0]["token_times"]) == 1
            assert len(decode) == 1 and len(decode[0]["token_times"]) == 12
        finally:
            proxy.send_signal(signal.SIGTERM)
            assert proxy.wait(timeout=20) == 0


def test_pd_proxy_refuses_a_spec_without_pd(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "crossover", "pdproxy", str(SEED)], capture_output=True,
                            text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "give --topology" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_demo_serves_a_real_fleets_missing_entrypoint_with_pdproxy(tmp_path: Path) -> None:
    """`crossover demo --no-sim` on a fleet whose P/D entrypoint nothing serves starts `crossover
    pdproxy` for it, and the sweep's P/D requests go through it to the prefill and decode instances."""
    spec, _, demo_spec = pd_fleet_and_moved_entrypoint(tmp_path)
    out = tmp_path / "run"
    with running_fleet(spec) as fleet:
        result = subprocess.run(
            [sys.executable, "-m", "crossover", "demo", "--headless", "--no-sim", "--spec", str(demo_spec),
             "--rate", "2", "--requests", "4", "--input-len", "64", "--output-len", "8", "--out", str(out)],
            capture_output=True, text=True, timeout=200, stdin=subprocess.DEVNULL)
        assert result.returncode == 0, result.stderr[-3000:]
        pids = json.loads((out / "logs" / "pids.json").read_text())
        assert set(pids) == {"pdproxy-pd1p1d", "sweep"}, pids
        assert len(fleet.requests("prefill-0")) == 4 and len(fleet.requests("decode-0")) == 4
    assert "entrypoint of pd1p1d" in (out / "logs" / "pdproxy-pd1p1d.log").read_text()
