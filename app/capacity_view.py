"""A `crossover capacity --out` folder as the app shows it: the ranked layouts, the verdict, the
crossover map and the Pareto chart, read from its capacity.json (capacity/output.py `to_json`).

The Pareto view is loadgen's own (`pareto_view`) over the layouts' predicted points along the map's
loads, so the chart is the one a sweep's run gets (app/charts.py `pareto_chart`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from crossover import slo
from crossover.capacity.output import KIND, RESULTS
from crossover.errors import UserError
from crossover.loadgen.analysis.pareto import THROUGHPUT_COLUMN, TPOT_COLUMN, ParetoView, pareto_view
from crossover.loadgen.plan import Mode


@dataclass(frozen=True)
class CapacityView:
    source: str  # the folder's name
    out_dir: Path
    axis: str  # Mode.axis: "concurrency" or "rate"
    verdict: str
    ranked: pd.DataFrame  # one row per layout, best first
    crossover_map: pd.DataFrame  # load, leaders ("a = b" for a tie)
    pareto: ParetoView
    workload: str


def is_capacity_folder(folder: Path) -> bool:
    return (folder / RESULTS).is_file()


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else math.nan


def _ranked(layouts: list[dict[str, Any]]) -> pd.DataFrame:
    rows = []
    for rank, item in enumerate(layouts, 1):
        capacity = item["capacity"]
        user = next((p for p in item.get("at_user") or [] if p), None) or {}
        band = item.get("goodput_per_gpu_band") or [None, None]
        rows.append({
            "rank": rank,
            "layout": item["label"],
            "profile": item["profile"],
            "gpus": item["gpus"],
            "capacity": _number(capacity["load"]),
            "capacity_low": _number(capacity["bracket"][0]),
            "capacity_high": _number(capacity["bracket"][1]),
            "censored": capacity.get("censored", ""),
            "goodput_per_gpu": _number(item["goodput_per_gpu"]),
            "goodput_per_gpu_low": _number(band[0]),
            "goodput_per_gpu_high": _number(band[1]),
            "price_per_hour": _number(item.get("price_per_hour")),
            "attainment_at_user": _number(user.get("attainment")),
            "ttft_p99_ms": _number(user.get("ttft_p99_ms")),
            "tpot_p99_ms": _number(user.get("tpot_p99_ms")),
            "itl_p99_ms": _number(user.get("itl_p99_ms")),
            "kv_usage_peak": _number(user.get("kv_usage_peak")),
            "preemptions": _number(user.get("preemptions")),
        })
    return pd.DataFrame(rows)


def _summary(layouts: list[dict[str, Any]]) -> pd.DataFrame:
    """The layouts' points along the map's loads as summary rows, the columns pareto_view reads."""
    rows = []
    for item in layouts:
        for point in item.get("along") or []:
            if not point:
                continue
            rows.append({
                "topology": item["key"],
                "level": point["load"],
                THROUGHPUT_COLUMN: _number(point["output_tps"]) / item["gpus"],
                TPOT_COLUMN: _number(point["tpot_median_ms"]),
                slo.attainment_column(): _number(point["attainment"]),
            })
    return pd.DataFrame(rows)


def load_capacity(folder: Path) -> CapacityView:
    """The folder's capacity.json as a view; a file that is not one is a one-line UserError."""
    path = folder / RESULTS
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise UserError(f"{path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise UserError(f"{path}: not a crossover capacity result (want \"kind\": \"{KIND}\")")
    try:
        workload = data["workload"]
        axis = Mode(workload["mode"]).axis
        layouts = list(data["layouts"])
        summary = _summary(layouts)
        return CapacityView(
            source=folder.name,
            out_dir=folder,
            axis=axis,
            verdict=str(data["verdict"]["sentence"]),
            ranked=_ranked(layouts),
            crossover_map=pd.DataFrame(
                [{axis: e["load"], "leaders": " = ".join(e["leaders"])} for e in data["crossover_map"]]
            ),
            pareto=pareto_view(summary, axis, data["slos_ms"], float(data["objective"])),
            workload=str(workload.get("lengths") or ""),
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise UserError(f"{path}: a field is missing or malformed ({exc!r})") from None
