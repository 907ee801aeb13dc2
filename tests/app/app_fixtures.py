"""Shared test data for the app's tests: a summary table shaped like crossover.loadgen.analysis.summary's,
written by hand, and a spec file on free loopback ports."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from crossover import slo
from crossover.loadgen.analysis.summary import per_gpu
from crossover.netutil import spec_on_free_ports
from crossover.spec import FleetSpec, load_spec
from tests.helpers import SPECS

SEED_SPEC = SPECS / "seed-70b-h100.yaml"


def seed_summary() -> pd.DataFrame:
    """The seed's TP=4x1 vs TP=2x2 table (aggregate output tokens/s), with made-up goodput and p99s."""
    tps = {"tp4x1": [200, 650, 1800, 2400, 2800, 2900], "tp2x2": [170, 620, 2100, 3600, 5200, 5800]}
    levels = [1, 4, 16, 32, 64, 128]
    rows = []
    for topology, values in tps.items():
        for level, value in zip(levels, values, strict=True):
            rows.append({
                "topology": topology, "level": float(level), "gpus": 4, "requests": 64, "failed": 0,
                "output_tps": float(value), "output_tps_per_gpu": value / 4.0,
                slo.GOODPUT_REQUESTS: value / 128.0, per_gpu(slo.GOODPUT_REQUESTS): value / 512.0,
                slo.GOODPUT_TOKENS: value * 0.9, "attainment": 1.0,
                "ttft_p99_ms": 50.0 * level, "tpot_p50_ms": 15.0 + level / 8,
                "tpot_p99_ms": 20.0 + level / 4, "itl_p99_ms": 25.0 + level / 3,
                "e2el_p99_ms": 1000.0 + level, "top_error": "",
            })
    return pd.DataFrame(rows)


def fast_scrape(spec: FleetSpec) -> FleetSpec:
    """Scrape every second over 10 s windows, so a short test sees server-side figures."""
    data = spec.model_dump(mode="json")
    data["scrape"].update(interval="1s", timeout="500ms", windows=["10s"])
    return FleetSpec.model_validate(data)


def spec_file_on_free_ports(folder: Path, source: Path = SEED_SPEC, time_scale: float | None = None,
                            scrape_fast: bool = False) -> tuple[FleetSpec, Path]:
    """A copy of an example spec with every URL on a free port, written where the app can read it;
    time_scale < 1 slows the simulator down, so a busy test machine distorts its timings less."""
    spec = spec_on_free_ports(load_spec(source))
    if time_scale is not None:
        data = spec.model_dump(mode="json")
        data["simulator"]["time_scale"] = time_scale
        spec = FleetSpec.model_validate(data)
    if scrape_fast:
        spec = fast_scrape(spec)
    path = folder / source.name
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json"), sort_keys=False))
    return spec, path
