"""Measured GPU step times beside the per-kernel model: the table in docs/simulator.md.

    python -m crossover.sim.profile benchmarks/gpu_profile_h200.csv compose/specs/llama70b-h200.yaml [--docs]

Reads the CSV that benchmarks/gpu_profile.py writes (its `decode`, `prefill` and `mixed` rows: one TP
rank's shard, no all-reduce, no host time) and prints, per cell, the measured time, the model's
`PerfModel.shard_gpu_seconds` for the spec's hardware, and the error. The spec gives the hardware and
the 70B shape; the 8B rows use Llama-3.1-8B's shape on the same hardware. `--docs` prints the
tables of docs/simulator.md instead; `--merge NEW.csv` first writes a later run's rows into CSV.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crossover.errors import UserError
from crossover.sim.model import PerfModel, StepLoad, allreduce_bytes_s, prefill_attention_pairs
from crossover.spec import FleetSpec, load_spec

STEP_KINDS = ("decode", "prefill", "mixed")
SHAPES: dict[str, dict[str, object]] = {
    "llama-3.1-8b": dict(name="meta-llama/Llama-3.1-8B-Instruct", params_b=8.03, layers=32, hidden_size=4096,
                         heads=32, kv_heads=8, intermediate_size=14336, vocab_size=128256),
    "llama-3.1-70b": dict(name="meta-llama/Llama-3.1-70B-Instruct", params_b=70.6, layers=80,
                          hidden_size=8192,
                          heads=64, kv_heads=8, intermediate_size=28672, vocab_size=128256),
}


@dataclass(frozen=True)
class Cell:
    kind: str
    model: str
    tp: int
    batch: int
    context: int
    prefill_tokens: int
    prefill_start: int
    measured_s: float
    modelled_s: float

    @property
    def error(self) -> float:
        return self.modelled_s / self.measured_s - 1


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open() as handle:
        return list(csv.DictReader(line for line in handle if not line.startswith("#")))


def read_header(path: Path) -> dict[str, str]:
    with path.open() as handle:
        pairs = (line[2:].split(": ", 1) for line in handle if line.startswith("# ") and ": " in line)
        return {key: value.strip() for key, value in pairs}


ROW_KEY = ("kind", "model", "tp", "batch", "context", "prefill_tokens", "prefill_start", "op", "tokens")


def merge_profile(base: Path, new: Path) -> tuple[int, int]:
    """Write into `base` the rows of `new` (a later run, e.g. `gpu_profile.py --parts late`): a row of the
    same cell or ceiling replaces the old one in place, others are added; the new run's date and command
    join the header under a numbered key. Returns (replaced, added)."""
    old_rows, new_rows = read_rows(base), read_rows(new)
    if not new_rows or set(ROW_KEY) - set(new_rows[0]):
        raise UserError(f"{new}: not a gpu_profile.py CSV (no rows with {', '.join(ROW_KEY)})")
    fields = list(old_rows[0]) if old_rows else list(new_rows[0])
    incoming = {tuple(r[k] for k in ROW_KEY): r for r in new_rows}
    merged, replaced = [], 0
    for row in old_rows:
        key = tuple(row[k] for k in ROW_KEY)
        if key in incoming:
            row, replaced = incoming.pop(key), replaced + 1
        merged.append(row)
    merged += incoming.values()
    header, added = read_header(base), read_header(new)
    runs = 1 + sum(key.startswith("command") for key in header)
    counts = f"({replaced} rows replaced, {len(incoming)} added)"
    lines = [line for line in base.read_text().splitlines() if line.startswith("#")]
    lines += [f"# date_{runs}: {added.get('date', '?')}",
              f"# command_{runs}: {added.get('command', '?')} {counts}"]
    with base.open("w", newline="") as handle:
        handle.write("\n".join(lines) + "\n")
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(merged)
    return replaced, len(incoming)


@dataclass(frozen=True)
class AllreduceFit:
    """The spec's all-reduce terms at one TP size, fitted to measured all-reduce times."""

    tp: int
    latency_us: float  # hardware.allreduce_latency_us
    gbps: float  # hardware.allreduce_gbps
    worst_error: float  # the largest |fitted / measured - 1| over the points


def fit_allreduce(tp: int, points: Sequence[tuple[int, float]]) -> AllreduceFit:
    """Fit `seconds = latency + allreduce_bytes_s(gbps, tp, bytes)` (the model's own size term, so the
    fitted bandwidth is the one it divides by) to (message bytes, seconds) points of one TP size.

    Least squares on the relative error: the times span three orders of magnitude from 1 KB to 256 MB,
    and on absolute error the large messages would leave the latency (the decode-sized term) unfitted.
    """
    if tp < 2:
        raise UserError(f"all-reduce fit at TP {tp}: one rank has no all-reduce")
    if len({size for size, _ in points}) < 2 or any(size <= 0 or t <= 0 for size, t in points):
        raise UserError(f"all-reduce fit at TP {tp}: want positive times at two message sizes or more")
    # t = a + b u, with u the size term at 1 GB/s: b = 1 / gbps. Weights 1/t^2 make the residuals relative.
    us = [allreduce_bytes_s(1.0, tp, size) for size, _ in points]
    ts = [t for _, t in points]
    triples = [(1 / t**2, u, t) for u, t in zip(us, ts, strict=True)]
    sw, su = sum(w for w, _, _ in triples), sum(w * u for w, u, _ in triples)
    suu, st = sum(w * u * u for w, u, _ in triples), sum(w * t for w, _, t in triples)
    sut = sum(w * u * t for w, u, t in triples)
    det = sw * suu - su * su
    a, b = (st * suu - su * sut) / det, (sw * sut - su * st) / det
    if a <= 0 or b <= 0:
        raise UserError(f"all-reduce fit at TP {tp}: latency {a * 1e6:.3g} us and 1/bandwidth {b:.3g} s/GB: "
                        "the times do not grow with the message size from a positive latency")
    worst = max(abs((a + b * u) / t - 1) for _, u, t in triples)
    return AllreduceFit(tp, a * 1e6, 1 / b, worst)


def allreduce_fits(rows: Iterable[dict[str, str]]) -> list[AllreduceFit]:
    """One fit per TP size from the `allreduce` rows benchmarks/allreduce_profile.py writes."""
    points: dict[int, list[tuple[int, float]]] = {}
    for row in rows:
        if row["kind"] == "allreduce":
            size = int(row["note"].removeprefix("bytes="))
            points.setdefault(int(row["tp"]), []).append((size, float(row["step_ms"]) / 1000))
    return [fit_allreduce(tp, found) for tp, found in sorted(points.items())]


def load_of(batch: int, context: int, chunk: int, start: int) -> StepLoad:
    return StepLoad(decode_seqs=batch, decode_context_tokens=batch * context, prefill_tokens=chunk,
                    prefill_attention_pairs=prefill_attention_pairs(start, chunk) if chunk else 0.0,
                    prefill_seqs=1 if chunk else 0, prefill_context_tokens=start + chunk if chunk else 0,
                    prefill_earlier_pairs=float(chunk * start))


def _spec_for(spec: FleetSpec, shape: str) -> FleetSpec:
    data = spec.model_dump(mode="json")
    data["model"] = {**data["model"], **SHAPES[shape]}
    return FleetSpec.model_validate(data)


def compare(rows: Iterable[dict[str, str]], spec: FleetSpec) -> list[Cell]:
    models: dict[tuple[str, int], PerfModel] = {}
    cells = []
    for row in rows:
        if row["kind"] not in STEP_KINDS or row["model"] not in SHAPES:
            continue
        key = (row["model"], int(row["tp"]))
        if key not in models:
            models[key] = PerfModel.for_instance(_spec_for(spec, key[0]), key[1])
        batch, context = int(row["batch"]), int(row["context"])
        chunk, start = int(row["prefill_tokens"]), int(row["prefill_start"])
        modelled = models[key].shard_gpu_seconds(load_of(batch, context, chunk, start))
        cells.append(Cell(row["kind"], key[0], key[1], batch, context, chunk, start,
                          float(row["step_ms"]) / 1000, modelled))
    return cells


def format_table(cells: Sequence[Cell]) -> list[str]:
    lines = ["| model | TP | step | measured ms | model ms | error |", "|---|---|---|---|---|---|"]
    for c in cells:
        step = (f"decode {c.batch} x {c.context}" if c.kind == "decode"
                else f"prefill {c.prefill_tokens} at {c.prefill_start}" if c.kind == "prefill"
                else f"decode {c.batch} x {c.context} + prefill {c.prefill_tokens} at {c.prefill_start}")
        lines.append(f"| {c.model} | {c.tp} | {step} | {c.measured_s * 1000:.2f} | "
                     f"{c.modelled_s * 1000:.2f} | "
                     f"{c.error:+.1%} |")
    return lines


def _figure(cell: Cell | None, digits: int) -> str:
    if cell is None:
        return ""
    return f"{cell.measured_s * 1000:.{digits}f} / {cell.modelled_s * 1000:.{digits}f} ({cell.error:+.0%})"


def docs_tables(cells: Sequence[Cell]) -> list[str]:
    """The tables of docs/simulator.md: a decode grid per model, then the prefill and mixed steps."""
    lines: list[str] = []
    shards = sorted({(c.model, c.tp) for c in cells}, key=lambda m: (m[0] != "llama-3.1-70b", m[1]))
    for model in dict.fromkeys(m for m, _ in shards):
        decode = {(c.tp, c.context, c.batch): c for c in cells if c.model == model and c.kind == "decode"}
        batches = sorted({b for _, _, b in decode})
        lines += [f"**{model}, decode** (ms measured / model, error; batch across, "
                  "context down; blank: KV does not fit)", "",
                  "| TP | context | " + " | ".join(map(str, batches)) + " |",
                  "|---|---|" + "---|" * len(batches)]
        for tp, context in sorted({(t, c) for t, c, _ in decode}):
            row = [_figure(decode.get((tp, context, b)), 2) for b in batches]
            lines.append(f"| {tp} | {context} | " + " | ".join(row) + " |")
        lines.append("")
    others = [c for c in cells if c.kind != "decode"]
    def step(c: Cell) -> tuple[str, int, int, int, int]:
        return c.kind, c.batch, c.context, c.prefill_tokens, c.prefill_start

    steps = list(dict.fromkeys(step(c) for c in others))
    by_step = {(*step(c), c.model, c.tp): c for c in others}
    names = [f"{m.removeprefix('llama-3.1-')} TP{tp}" for m, tp in shards]
    lines += ["**Prefill chunks and mixed chunked-prefill steps** (ms measured / model, error)", "",
              "| step | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for kind, batch, context, chunk, start in steps:
        label = (f"prefill {chunk} at {start}" if kind == "prefill"
                 else f"{batch} x {context} + prefill {chunk} at {start}")
        row = [_figure(by_step.get((kind, batch, context, chunk, start, m, tp)), 1) for m, tp in shards]
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return lines


def summary(cells: Sequence[Cell], tolerance: float = 0.10) -> str:
    errors = [abs(c.error) for c in cells]
    worst = max(cells, key=lambda c: abs(c.error))
    return (f"{len(cells)} cells: mean |error| {statistics.mean(errors):.1%}, "
            f"{sum(e <= tolerance for e in errors)} within {tolerance:.0%}, worst {worst.error:+.1%} "
            f"({worst.model} TP {worst.tp} {worst.kind} batch {worst.batch} context {worst.context} "
            f"prefill {worst.prefill_tokens} at {worst.prefill_start})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover.sim.profile",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("spec")
    parser.add_argument("--worst", type=int, default=0, help="print only the N worst cells")
    parser.add_argument("--docs", action="store_true", help="print the tables of docs/simulator.md instead")
    parser.add_argument("--allreduce", action="store_true",
                        help="CSV is benchmarks/allreduce_profile.py's: print the spec's "
                             "allreduce_latency_us and allreduce_gbps fitted per TP size instead")
    parser.add_argument("--merge", type=Path, metavar="NEW_CSV",
                        help="first write a later run's rows into CSV (same cells replaced, others added)")
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        if spec.hardware.kernel_us is None:
            raise UserError(f"{args.spec}: hardware.kernel_us: the per-kernel model needs the kernel costs")
        if args.merge is not None:
            replaced, added = merge_profile(args.csv, args.merge)
            print(f"{args.csv}: {replaced} rows replaced and {added} added from {args.merge}",
                  file=sys.stderr)
        rows = read_rows(args.csv)
        if args.allreduce:
            fits = allreduce_fits(rows)
            if not fits:
                raise UserError(f"{args.csv}: no allreduce rows")
            hw = spec.hardware
            print(f"spec now: allreduce_latency_us {hw.allreduce_latency_us}, "
                  f"allreduce_gbps {hw.allreduce_gbps}")
            for fit in fits:
                print(f"TP {fit.tp}: allreduce_latency_us {fit.latency_us:.1f}, "
                      f"allreduce_gbps {fit.gbps:.0f} (worst point {fit.worst_error:.1%} off)")
            return 0
    except UserError as exc:
        print(f"profile: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"profile: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 2
    cells = compare(rows, spec)
    if not cells:
        print(f"profile: {args.csv}: no decode, prefill or mixed rows", file=sys.stderr)
        return 2
    shown = sorted(cells, key=lambda c: -abs(c.error))[:args.worst] if args.worst else cells
    print("\n".join(docs_tables(cells) if args.docs else format_table(shown)))
    print(f"\n{summary(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
