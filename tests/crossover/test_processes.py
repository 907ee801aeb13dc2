"""crossover.processes: a stopped group leaves no descendant behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crossover.processes import cpu_seconds, die_with_parent, proc_stat, stop_group


def _group_alive(pgid: int, within_s: float = 5.0) -> bool:
    """Whether the group still has a member after `within_s` (a killed orphan lingers until its
    new parent reaps it)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def _start(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sh", "-c", script], stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)


@pytest.mark.parametrize("script", [
    "trap '' TERM; sleep 60 & wait",  # a leader that ignores SIGTERM: SIGKILL after the grace
    "sleep 60 & exit 0",  # the leader gone, its child lingering: the group is swept anyway
])
def test_stop_group_leaves_no_descendant(script: str) -> None:
    process = _start(script)
    try:
        assert _group_alive(process.pid, within_s=0.0)
        stop_group(process, grace_s=1.0)
        assert process.poll() is not None
        assert not _group_alive(process.pid)
    finally:
        stop_group(process, grace_s=1.0)


def test_stop_group_of_a_finished_process_is_no_error() -> None:
    process = _start("exit 3")
    process.wait(10)
    stop_group(process, grace_s=1.0)
    assert process.returncode == 3


def test_proc_stat_reads_the_fields_after_a_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    # a command name may hold ") (": the fields start after the last one
    odd = tmp_path / "a) (b"
    odd.symlink_to(Path(sys.executable))
    child = subprocess.Popen([str(odd), "-c", "import time; time.sleep(30)"])
    try:
        fields = proc_stat(child.pid)
        assert fields[0] in ("R", "S", "D") and int(fields[1]) == os.getpid()
        assert int(fields[2]) == os.getpgid(child.pid)
    finally:
        child.kill()
        child.wait()
    with pytest.raises(OSError):
        proc_stat(child.pid)


def test_cpu_seconds_counts_this_process_work() -> None:
    user, system = cpu_seconds(os.getpid())
    deadline = time.process_time() + 0.3
    while time.process_time() < deadline:
        pass
    later_user, later_system = cpu_seconds(os.getpid())
    assert later_user + later_system - user - system >= 0.2  # 10-ms ticks: 0.3 s of work reads 0.29-0.31
