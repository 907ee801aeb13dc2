"""Child processes that leave nothing behind: each started in its own process group, stopped as a group.

Why groups: vLLM forks an engine core and `crossover app` runs Streamlit as its own child; signalling
the group reaches every descendant. Start children with `start_new_session=True` and
`preexec_fn=die_with_parent`, stop them with `stop_group`.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from pathlib import Path


def die_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies, so a killed run never leaves a
    server behind (Linux prctl PR_SET_PDEATHSIG; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def signal_group(leader_pid: int, signum: int) -> None:
    """Send signum to the process group led by leader_pid; a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader_pid, signum)


def stop_group(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM the group `process` leads, then SIGKILL what is left after `grace_s`; waits either way."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # The leader may be gone while a grandchild of its group lingers: sweep the group too.
    signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)


def proc_stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name (Linux): [0] the state, [1] the parent,
    [2] the process group, [11] and [12] user and system CPU in clock ticks. OSError once it is gone."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process and all its threads so far, from /proc."""
    fields, tick = proc_stat(pid), os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick
