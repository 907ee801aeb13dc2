"""Rules and dashboards generation, side by side: libyaml's emitter vs PyYAML's pure-Python one
(the reason render.py prefers CSafeDumper), plus promtool's time on each generated unit test.

    python benchmarks/bench_rules.py [--repeat 3] [--smoke]

Prints one table; the ratio column is what docs/performance.md records.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from pathlib import Path

from figures import add_smoke_flag, print_figures, skipped

from crossover.dashboards.generate import example_outputs as dashboard_outputs
from crossover.rules import render
from crossover.rules.generate import PROMTOOL_DIR
from crossover.rules.generate import example_outputs as rule_outputs

REPO = Path(__file__).resolve().parent.parent


def _best(function: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        function()  # type: ignore[operator]
        best = min(best, time.perf_counter() - start)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    add_smoke_flag(parser)
    args = parser.parse_args()
    if args.smoke:  # one round of each; promtool on the smallest unit test only
        args.repeat = 1
    files = rule_outputs(REPO)
    size = sum(len(t) for t in files.values())
    fast = _best(lambda: rule_outputs(REPO), args.repeat)
    render.DUMPER = render.PurePythonDumper
    try:
        slow = _best(lambda: rule_outputs(REPO), args.repeat)
        assert rule_outputs(REPO) == files, "both emitters must write the same bytes"
    finally:
        render.DUMPER = render.LibyamlDumper
    dashboards = _best(lambda: dashboard_outputs(REPO), args.repeat)
    print(f"rules for {len(list((REPO / 'compose' / 'specs').glob('*.yaml')))} example specs "
          f"({len(files)} files, {size / 1e6:.1f} MB):")
    print(f"  libyaml emitter      {fast:7.2f} s")
    print(f"  pure-Python emitter  {slow:7.2f} s   ratio {slow / fast:.1f}x")
    print(f"dashboards for the same specs: {dashboards:.2f} s")
    figures: dict[str, object] = {"specs": len(list((REPO / "compose" / "specs").glob("*.yaml"))),
                                  "files": len(files), "megabytes": size / 1e6, "rules_libyaml_s": fast,
                                  "rules_pure_python_s": slow, "emitter_ratio": slow / fast,
                                  "dashboards_s": dashboards}
    promtool = shutil.which("promtool")
    folders = sorted(folder / PROMTOOL_DIR for folder in (REPO / "rules" / "generated").iterdir())
    if args.smoke:
        folders = [min(folders, key=lambda folder: (folder / "rules.test.yml").stat().st_size)]
    if promtool:
        took, failed = {}, 0
        for folder in folders:
            start = time.perf_counter()
            result = subprocess.run([promtool, "test", "rules", "rules.test.yml"], cwd=folder,
                                    capture_output=True, text=True, check=False)
            took[folder.parent.name] = time.perf_counter() - start
            failed += result.returncode != 0
            print(f"  promtool test rules {folder.parent.name:16} {took[folder.parent.name]:6.2f} s "
                  f"{'ok' if result.returncode == 0 else 'FAILED'}")
        figures.update(promtool_s=took, promtool_failed=failed)
    else:
        skipped("promtool test rules (promtool is not installed)")
    print_figures(figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
