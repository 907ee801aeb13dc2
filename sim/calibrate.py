"""Calibration tables: simulated vs published numbers for the two seed presets.

    python -m crossover.sim.calibrate compose/specs/seed-70b-h100.yaml
    python -m crossover.sim.calibrate compose/specs/pd-8k-prompts.yaml

A spec with two colocated topologies gets the closed-loop throughput table (aggregate output tokens/s
per concurrency, and the ground-truth crossover); a spec with a P/D topology gets the open-loop
table (ITL p99 at light load and at the seed's rate, TTFT/TPOT p99, attainment at the spec's SLOs).
Published figures are shown beside the simulated ones where the spec is one of the seeds' presets.
Everything comes from crossover.sim.truth (the model in virtual time): no servers, a few seconds.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from crossover.errors import UserError
from crossover.sim.truth import closed_loop, ground_truth_crossover, open_loop
from crossover.spec import FleetSpec, load_spec

# First seed (anchors.md): Llama-3.1-70B on 4x H100 SXM, aggregate output tokens/s.
SEED_CONCURRENCIES: tuple[int, ...] = (1, 4, 16, 32, 64, 128)
SEED_TABLE: dict[str, tuple[float, ...]] = {
    "tp4x1": (200, 650, 1800, 2400, 2800, 2900),
    "tp2x2": (170, 620, 2100, 3600, 5200, 5800),
}
# The seed gives no request shape; a chat-like one (512 in, 256 out) is the calibration workload.
SEED_INPUT_LEN = 512
SEED_OUTPUT_LEN = 256
SEED_TOLERANCE = 0.20

# Second seed: ~8K-token prompts, 256 output tokens, 0.4 req/s, 100 requests (vllm bench serve shape).
PD_INPUT_LEN = 8192
PD_OUTPUT_LEN = 256
PD_RATE = 0.4
PD_LIGHT_RATE = 0.02
PD_REQUESTS = 100
PD_PUBLISHED_ITL_P99_MS = {"colocated": (23.0, 169.0), "pd1p1d": (29.0, 52.0)}  # (light, loaded)


@dataclass(frozen=True)
class ThroughputRow:
    concurrency: int
    simulated: dict[str, float]  # topology -> output tokens/s
    published: dict[str, float]  # empty when the spec is not a seed preset

    def winner(self, table: dict[str, float]) -> str:
        return max(table, key=lambda name: table[name])


def throughput_table(spec: FleetSpec, topologies: Sequence[str], concurrencies: Sequence[int],
                     input_len: int, output_len: int) -> list[ThroughputRow]:
    published = all(t in SEED_TABLE for t in topologies) and tuple(concurrencies) == SEED_CONCURRENCIES
    rows = []
    for index, concurrency in enumerate(concurrencies):
        simulated = {t: closed_loop(spec, t, concurrency, input_len, output_len).output_tokens_per_s
                     for t in topologies}
        rows.append(ThroughputRow(concurrency, simulated,
                                  {t: SEED_TABLE[t][index] for t in topologies} if published else {}))
    return rows


@dataclass(frozen=True)
class OpenLoopRow:
    topology: str
    light_itl_p99_s: float
    itl_p99_s: float
    ttft_p99_s: float
    tpot_p99_s: float
    attainment: float  # share of requests meeting the TTFT and TPOT SLOs (crossover.slo)


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, int(len(ordered) * 0.99 + 0.999999) - 1)]


def pd_table(spec: FleetSpec, rate: float = PD_RATE, input_len: int = PD_INPUT_LEN,
             output_len: int = PD_OUTPUT_LEN, requests: int = PD_REQUESTS) -> list[OpenLoopRow]:
    slos = spec.slos
    ttft_s = slos.ttft_ms / 1000 if slos.ttft_ms else None
    tpot_s = slos.tpot_ms / 1000 if slos.tpot_ms else None
    rows = []
    for topology in spec.topologies:
        light = open_loop(spec, topology, PD_LIGHT_RATE, input_len, output_len, requests)
        loaded = open_loop(spec, topology, rate, input_len, output_len, requests)
        rows.append(OpenLoopRow(
            topology.name, light.itl_quantile(0.99), loaded.itl_quantile(0.99),
            _p99([t.ttft for t in loaded.traces]), _p99([t.tpot for t in loaded.traces]),
            loaded.attainment(ttft_s, tpot_s)))
    return rows


def _format_throughput(rows: list[ThroughputRow], topologies: Sequence[str]) -> list[str]:
    head = "| concurrency | " + " | ".join(f"{t} simulated | {t} published" if rows[0].published
                                          else f"{t} simulated" for t in topologies) + " | winner |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for row in rows:
        cells = []
        for t in topologies:
            cells.append(f"{row.simulated[t]:.0f}")
            if row.published:
                error = row.simulated[t] / row.published[t] - 1
                cells.append(f"{row.published[t]:.0f} ({error:+.0%})")
        winner = row.winner(row.simulated)
        if row.published:
            theirs = row.winner(row.published)
            winner += " (same)" if winner == theirs else f" (published: {theirs})"
        lines.append(f"| {row.concurrency} | " + " | ".join(cells) + f" | {winner} |")
    return lines


def _format_pd(rows: list[OpenLoopRow], spec: FleetSpec, rate: float) -> list[str]:
    slos = f"TTFT<={spec.slos.ttft_ms:g} ms, TPOT<={spec.slos.tpot_ms:g} ms"
    lines = [f"| topology | ITL p99 light ({PD_LIGHT_RATE} req/s) | ITL p99 at {rate} req/s | ratio | "
             f"TTFT p99 | TPOT p99 | attainment ({slos}) | published ITL p99 light -> loaded |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        published = PD_PUBLISHED_ITL_P99_MS.get(row.topology)
        shown = f"{published[0]:g} -> {published[1]:g} ms" if published else "-"
        lines.append(f"| {row.topology} | {row.light_itl_p99_s * 1000:.1f} ms | "
                     f"{row.itl_p99_s * 1000:.1f} ms | "
                     f"{row.itl_p99_s / row.light_itl_p99_s:.1f}x | {row.ttft_p99_s * 1000:.0f} ms | "
                     f"{row.tpot_p99_s * 1000:.1f} ms | {row.attainment:.0%} | {shown} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m crossover.sim.calibrate",
                                     description=(__doc__ or "").split("\n")[0])
    parser.add_argument("spec")
    parser.add_argument("--input-len", type=int, default=None)
    parser.add_argument("--output-len", type=int, default=None)
    parser.add_argument("--concurrencies", default=",".join(map(str, SEED_CONCURRENCIES)))
    parser.add_argument("--rate", type=float, default=PD_RATE)
    args = parser.parse_args(argv)
    try:
        spec = load_spec(args.spec)
        concurrencies = [int(c) for c in args.concurrencies.split(",")]
        if not concurrencies or min(concurrencies) < 1:
            raise ValueError
    except UserError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    except ValueError:
        print(f"calibrate: --concurrencies: want positive integers separated by commas, got "
              f"{args.concurrencies!r}", file=sys.stderr)
        return 2
    if any(t.disaggregated for t in spec.topologies):
        input_len = args.input_len or PD_INPUT_LEN
        output_len = args.output_len or PD_OUTPUT_LEN
        print(f"{args.spec}: open loop, {input_len} in / {output_len} out, {PD_REQUESTS} requests\n")
        print("\n".join(_format_pd(pd_table(spec, args.rate, input_len, output_len), spec, args.rate)))
        return 0
    input_len = args.input_len or SEED_INPUT_LEN
    output_len = args.output_len or SEED_OUTPUT_LEN
    names = [t.name for t in spec.topologies][:2]
    if len(names) < 2:
        print(f"calibrate: {args.spec}: needs two topologies to compare", file=sys.stderr)
        return 2
    rows = throughput_table(spec, names, concurrencies, input_len, output_len)
    print(f"{args.spec}: closed loop, {input_len} in / {output_len} out, aggregate output tokens/s\n")
    print("\n".join(_format_throughput(rows, names)))
    crossing = ground_truth_crossover(spec, names[0], names[1], input_len, output_len, concurrencies)
    print(f"\nground-truth crossover ({names[1]} overtakes {names[0]}): "
          + (f"concurrency {crossing:.1f}" if crossing is not None else "none in range"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
