"""CI=true turns every kind of skip into a failure; locally a skip stays a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

PROBE = '''
import pytest
def test_skip():
    pytest.skip("no thing")
@pytest.mark.skipif(True, reason="cond")
def test_skipif():
    pass
def test_importorskip():
    pytest.importorskip("crossover_no_such_module")
@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False
'''
MODULE_SKIP = 'import pytest\npytest.importorskip("crossover_no_such_module")\ndef test_never():\n    pass\n'


def run_probe(tmp_path: Path, ci: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "test_module_skip.py").write_text(MODULE_SKIP)
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.ci_guard",
                           "-p", "no:cacheprovider", "--continue-on-collection-errors",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


@pytest.mark.parametrize("ci", ["true", "false"])
def test_skips_fail_only_under_ci(tmp_path: Path, ci: str) -> None:
    result = run_probe(tmp_path, ci)
    summary = result.stdout.strip().splitlines()[-1]
    if ci == "true":
        assert result.returncode == 1, result.stdout
        # test_skip and test_importorskip fail, test_skipif errors (its skip is in setup), the
        # module-level importorskip errors at collection; an xfail stays an xfail.
        assert "2 failed" in summary and "2 errors" in summary and "1 xfailed" in summary, summary
        assert "skipped" not in summary
        assert "skipped under CI=true" in result.stdout
    else:
        assert result.returncode == 0, result.stdout
        assert "4 skipped" in summary and "1 xfailed" in summary, summary
