"""The per-kernel model against the H200 measurements (docs/simulator.md, "Measured physics: H200")."""

from __future__ import annotations

from pathlib import Path

import pytest

from crossover.sim.profile import Cell, compare, main, read_rows
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
