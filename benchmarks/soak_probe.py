"""Run `crossover exporter ...` with tracemalloc on and a thread that writes, every `--every`
seconds, one JSON line: the Python heap the interpreter traces, the process's RSS and the live
objects' count, plus the source lines whose traced memory grew most since the first report after
`--baseline` seconds. Used by `benchmarks/soak.py --trace` to tell a leak (traced memory grows)
from the C allocator keeping freed memory (RSS grows, traced memory flat).

Run: python benchmarks/soak_probe.py OUT.jsonl [--every 30] [--baseline 120] -- exporter SPEC ...
"""

from __future__ import annotations

import argparse
import gc
import json
import runpy
import sys
import threading
import time
import tracemalloc
from pathlib import Path


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024


def report(out: Path, every: float, baseline_after: float) -> None:
    started = time.monotonic()
    baseline: tracemalloc.Snapshot | None = None
    with out.open("a") as sink:
        while True:
            time.sleep(every)
            at = time.monotonic() - started
            current, peak = tracemalloc.get_traced_memory()
            row: dict[str, object] = {"at": round(at, 1), "traced_mb": current / 2**20,
                                      "traced_peak_mb": peak / 2**20, "rss_mb": rss_mb(),
                                      "objects": len(gc.get_objects())}
            if at >= baseline_after:
                snapshot = tracemalloc.take_snapshot()
                if baseline is None:
                    baseline = snapshot
                else:
                    grown = snapshot.compare_to(baseline, "lineno")[:6]
                    row["grown"] = [f"{s.traceback[0].filename}:{s.traceback[0].lineno} "
                                    f"{s.size_diff / 1024:+.0f} KB ({s.count_diff:+d} blocks)" for s in grown]
            sink.write(json.dumps(row) + "\n")
            sink.flush()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--baseline", type=float, default=120.0)
    if "--" not in sys.argv:
        sys.exit("soak_probe: put the crossover command after --")
    split = sys.argv.index("--")
    args = parser.parse_args(sys.argv[1:split])
    command = sys.argv[split + 1:]
    tracemalloc.start(1)
    threading.Thread(target=report, args=(args.out, args.every, args.baseline), daemon=True,
                     name="soak-probe").start()
    sys.argv = ["crossover", *command]
    runpy.run_module("crossover", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
