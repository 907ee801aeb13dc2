from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pandas as pd
import pytest

from crossover.app import runs


def requests_table() -> pd.DataFrame:
    return pd.DataFrame({"topology": ["tp4x1", "tp2x2"], "level": [1.0, 1.0], "ttft": [0.03, 0.04],
                         "itl": [[0.02, 0.021], [0.03]], "chunk_times": [[0.03, 0.05], [0.04]],
                         "chunk_tokens": [[1, 1], [1]]})


def test_list_runs_finds_sweep_folders_newest_first(tmp_path):
    assert runs.list_runs(tmp_path / "missing") == []
    for name, when in (("old", 1_000_000), ("new", 2_000_000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text("{}")
        os.utime(tmp_path / name / "run.json", (when, when))
    (tmp_path / "not-a-run").mkdir()
    (tmp_path / "stray.txt").write_text("x")
    assert [r.name for r in runs.list_runs(tmp_path)] == ["new", "old"]


def test_last_change_follows_the_summary_rewritten_after_each_level(tmp_path):
    with pytest.raises(FileNotFoundError):
        runs.last_change(tmp_path)
    (tmp_path / "run.json").write_text("{}")
    os.utime(tmp_path / "run.json", (1_000, 1_000))
    assert runs.last_change(tmp_path) == runs.FolderChange(1_000, False)
    (tmp_path / "summary.parquet").write_bytes(b"")
    os.utime(tmp_path / "summary.parquet", (2_000, 2_000))
    assert runs.last_change(tmp_path) == runs.FolderChange(2_000, False)


def test_a_folder_is_walked_at_most_once_per_look(tmp_path, monkeypatch):
    """The page lists past runs and asks the one shown when it changed on every rerun: a folder of
    vllm bench result files is walked once for each, a sweep folder never."""
    bench, sweep = tmp_path / "bench", tmp_path / "sweep"
    (bench / "nested").mkdir(parents=True)
    sweep.mkdir()
    for path, when in ((bench / "nested" / "one.json", 1_000), (bench / "two.json", 3_000),
                       (sweep / "run.json", 2_000)):
        path.write_text("{}")
        os.utime(path, (when, when))
    walked = []
    rglob = Path.rglob

    def counted(self, *args, **kwargs):
        walked.append(self)
        return rglob(self, *args, **kwargs)

    monkeypatch.setattr(Path, "rglob", counted)
    assert [(r.name, r.modified) for r in runs.list_runs(tmp_path)] == [
        ("bench (vllm bench results)", 3_000), ("sweep", 2_000)]
    assert walked == [bench]
    walked.clear()
    assert runs.last_change(bench) == runs.FolderChange(3_000, True)
    assert runs.last_change(sweep) == runs.FolderChange(2_000, False)
    assert walked == [bench]


def test_new_run_dir_never_reuses_a_folder(tmp_path):
    first = runs.new_run_dir(tmp_path, now=1_700_000_000)
    first.mkdir()
    second = runs.new_run_dir(tmp_path, now=1_700_000_000)
    assert first.name.startswith("sweep-") and second.name == first.name + "-2"


@pytest.mark.parametrize("fmt", runs.FORMATS)
def test_tables_round_trip_in_every_format(fmt):
    table = requests_table()
    data = runs.table_bytes(table, fmt)
    if fmt == "csv":
        back = pd.read_csv(io.BytesIO(data))
        assert json.loads(str(back["itl"].iloc[0])) == [0.02, 0.021]
    elif fmt == "parquet":
        back = pd.read_parquet(io.BytesIO(data))
        assert list(back["itl"].iloc[0]) == [0.02, 0.021]
    else:
        back = pd.DataFrame(json.loads(data))
        assert back.loc[0, "itl"] == [0.02, 0.021]
    assert list(back["topology"]) == ["tp4x1", "tp2x2"]
    assert back["ttft"].tolist() == [0.03, 0.04]


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="unknown format"):
        runs.table_bytes(requests_table(), "xlsx")


def test_safe_name():
    assert runs.safe_name("sweep 1/../x") == "sweep_1_.._x"
