"""The per-kernel model against the H200 measurements (docs/simulator.md, "Measured physics: H200")."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from crossover.errors import UserError
from crossover.sim.model import allreduce_bytes_s
from crossover.sim.profile import Cell, allreduce_fits, compare, fit_allreduce, main, read_rows
from crossover.spec import load_spec
from tests.helpers import REPO, SPECS

CSV = REPO / "benchmarks" / "gpu_profile_h200.csv"
SPEC = SPECS / "llama70b-h200.yaml"
TOLERANCE = 0.10


def key(cell: Cell) -> tuple[str, int, str, int, int, int, int]:
    return (cell.model, cell.tp, cell.kind, cell.batch, cell.context, cell.prefill_tokens, cell.prefill_start)


@pytest.fixture(scope="module")
def cells() -> list[Cell]:
    return compare(read_rows(CSV), load_spec(SPEC))


def test_every_step_of_both_models_is_measured_and_compared(cells: list[Cell]) -> None:
    assert {(c.model, c.tp) for c in cells} == {("llama-3.1-8b", tp) for tp in (1, 2, 4, 8)} | {
        ("llama-3.1-70b", tp) for tp in (2, 4, 8)}
    assert {c.kind for c in cells} == {"decode", "prefill", "mixed"} and len(cells) == 402


def test_the_model_is_within_10_percent_of_every_cell(cells: list[Cell]) -> None:
    beyond = {key(c): round(c.error, 3) for c in cells if abs(c.error) > TOLERANCE}
    assert not beyond, beyond


def test_profile_cli_prints_the_table_and_rejects_bad_input(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(CSV), str(SPEC), "--worst", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("| llama-3.1-") == 3 and "402 cells" in out
    assert main([str(tmp_path / "missing.csv"), str(SPEC)]) == 2
    err = capsys.readouterr().err
    assert "missing.csv" in err and err.count("\n") == 1
    assert main([str(CSV), str(SPECS / "seed-70b-h100.yaml")]) == 2
    err = capsys.readouterr().err
    assert "hardware.kernel_us" in err and err.count("\n") == 1


def test_a_later_run_merges_into_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "profile.csv"
    base.write_bytes(CSV.read_bytes())
    new = tmp_path / "late.csv"
    new.write_text("# date: 2026-12-04T10:00:00Z\n# command: python benchmarks/gpu_profile.py --parts late\n"
                   "kind,model,tp,batch,context,prefill_tokens,prefill_start,op,tokens,step_ms,reps,note\n"
                   "prefill,llama-3.1-8b,1,0,0,2048,6144,,2048,70.0000,3,CUDNN_SPLIT\n"
                   "attn_prefill,llama-3.1-8b,1,,,4096,4096,,,0.5000,3,CUDNN_SPLIT\n")
    before = len(read_rows(base))
    assert main([str(base), str(SPEC), "--merge", str(new), "--worst", "1"]) == 0
    assert "1 rows replaced and 1 added" in capsys.readouterr().err
    rows = read_rows(base)
    assert len(rows) == before + 1
    late = [r for r in rows if (r["kind"], r["model"], r["tp"], r["prefill_start"]) ==
            ("prefill", "llama-3.1-8b", "1", "6144")]
    assert [(r["step_ms"], r["note"]) for r in late] == [("70.0000", "CUDNN_SPLIT")]
    header = base.read_text()
    assert "# command_3: python benchmarks/gpu_profile.py --parts late (1 rows replaced, 1 added)" in header
    assert "# date_3: 2026-12-04T10:00:00Z" in header and "# command: python" in header
    new.write_text("not,a,profile\n1,2,3\n")
    assert main([str(base), str(SPEC), "--merge", str(new)]) == 2
    err = capsys.readouterr().err
    assert "late.csv: not a gpu_profile.py CSV" in err and err.count("\n") == 1
    assert len(read_rows(base)) == before + 1  # nothing lost


SIZES = [1024 * 4**i for i in range(10)]  # what benchmarks/allreduce_profile.py measures: 1 KB .. 256 MB


def synthetic(tp: int, latency_us: float, gbps: float, noise: float, seed: int) -> list[tuple[int, float]]:
    """All-reduce times from the model's own formula, each off by up to +-noise (relative)."""
    rng = random.Random(seed)
    return [(size, (latency_us * 1e-6 + allreduce_bytes_s(gbps, tp, size)) * (1 + rng.uniform(-noise, noise)))
            for size in SIZES]


@pytest.mark.parametrize(("tp", "latency_us", "gbps"), [(2, 8.0, 300.0), (4, 12.0, 360.0), (8, 25.0, 150.0)])
def test_the_allreduce_fit_recovers_latency_and_bandwidth(tp: int, latency_us: float, gbps: float) -> None:
    exact = fit_allreduce(tp, synthetic(tp, latency_us, gbps, 0.0, 0))
    assert exact.latency_us == pytest.approx(latency_us, rel=1e-6)
    assert exact.gbps == pytest.approx(gbps, rel=1e-6)
    for seed in range(5):
        fit = fit_allreduce(tp, synthetic(tp, latency_us, gbps, 0.05, seed))
        assert fit.latency_us == pytest.approx(latency_us, rel=0.1), seed
        assert fit.gbps == pytest.approx(gbps, rel=0.1), seed
        assert 0 < fit.worst_error < 0.15


def test_the_allreduce_fit_rejects_what_it_cannot_fit() -> None:
    with pytest.raises(UserError, match="one rank"):
        fit_allreduce(1, synthetic(2, 10.0, 300.0, 0.0, 0))
    with pytest.raises(UserError, match="two message sizes"):
        fit_allreduce(2, [(1024, 1e-5), (1024, 1.1e-5)])
    with pytest.raises(UserError, match="do not grow"):  # slower for smaller messages: no latency + size
        fit_allreduce(2, [(1024, 1e-3), (1 << 20, 1e-5), (1 << 24, 1e-6)])


def test_profile_cli_fits_the_allreduce_rows_per_tp(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["# gpu: synthetic",
             "kind,model,tp,batch,context,prefill_tokens,prefill_start,op,tokens,step_ms,reps,note"]
    for tp, latency_us, gbps in ((2, 8.0, 300.0), (4, 12.0, 360.0)):
        lines += [f"allreduce,,{tp},,,,,,,{t * 1000:.6f},20,bytes={size}"
                  for size, t in synthetic(tp, latency_us, gbps, 0.0, 0)]
    lines.append("decode,tiny,2,1,32,0,0,,1,1.0000,20,")
    path = tmp_path / "allreduce.csv"
    path.write_text("\n".join(lines) + "\n")
    fits = allreduce_fits(read_rows(path))
    assert [(f.tp, round(f.latency_us, 1), round(f.gbps)) for f in fits] == [(2, 8.0, 300), (4, 12.0, 360)]
    assert main([str(path), str(SPEC), "--allreduce"]) == 0
    out = capsys.readouterr().out
    assert "TP 2: allreduce_latency_us 8.0, allreduce_gbps 300" in out
    assert "TP 4: allreduce_latency_us 12.0, allreduce_gbps 360" in out
    assert main([str(CSV), str(SPEC), "--allreduce"]) == 2  # gpu_profile.py's CSV has no all-reduce rows
    err = capsys.readouterr().err
    assert "no allreduce rows" in err and err.count("\n") == 1
