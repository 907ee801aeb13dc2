"""Child processes of the demo: each in its own process group, logged to a file, stopped as a group.

Why process groups: a `crossover app` runs Streamlit as its own child and vLLM forks an engine core;
signalling the group reaches every descendant, so Ctrl-C leaves nothing behind. Children also get
SIGTERM from the kernel if the demo itself dies without cleaning up (PR_SET_PDEATHSIG), and they do
not see the terminal's Ctrl-C themselves: the demo stops them in reverse start order instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crossover.errors import UserError
from crossover.processes import die_with_parent, signal_group, stop_group


def crossover_command(*args: str) -> list[str]:
    """A `crossover SUBCOMMAND ...` command line run by this same interpreter (no PATH lookup)."""
    return [sys.executable, "-m", "crossover", *args]


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """True when url answers 2xx right now."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return 200 <= int(response.status) < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:].strip()
    except OSError:
        return ""


@dataclass
class Child:
    name: str
    command: list[str]
    log_path: Path
    process: subprocess.Popen[bytes]
    # SIGINT before SIGTERM: for a child that cleans up on Ctrl-C (the sweep restores the terminal
    # its live progress display took over, and keeps what it measured).
    interrupt_first: bool = False

    @property
    def pid(self) -> int:
        return self.process.pid

    def running(self) -> bool:
        return self.process.poll() is None

    def signal_group(self, signum: int) -> None:
        signal_group(self.pid, signum)

    def stop(self, grace: float = 8.0) -> None:
        """SIGTERM the whole group, then SIGKILL what is left after `grace` seconds."""
        stop_group(self.process, grace)


@dataclass
class Supervisor:
    """Starts children and stops them all, last started first. Use as a context manager."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)

    def __enter__(self) -> Supervisor:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()

    def start(self, name: str, command: Sequence[str], env: dict[str, str] | None = None,
              cwd: Path | None = None, passthrough: bool = False, interrupt_first: bool = False) -> Child:
        """Start a child; its output goes to logs/NAME.log, or to the demo's own with passthrough."""
        log_path = self.log_dir / f"{name}.log"
        log = log_path.open("ab")
        try:
            process = subprocess.Popen(
                list(command), stdout=None if passthrough else log,
                stderr=None if passthrough else subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})}, cwd=cwd, start_new_session=True,
                preexec_fn=die_with_parent)  # single-threaded here
        except OSError as exc:
            raise UserError(f"cannot start {name} ({command[0]}): {exc.strerror}") from None
        finally:
            log.close()
        child = Child(name=name, command=list(command), log_path=log_path, process=process,
                      interrupt_first=interrupt_first)
        self.children.append(child)
        self._write_pids()
        return child

    def wait_ready(self, child: Child, ready: Callable[[], bool], timeout: float) -> None:
        """Poll `ready` until it holds; a child that exits or stays unready is a one-line error."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.running():
                raise UserError(f"{child.name} exited with status {child.process.returncode} during "
                                f"start-up; its log {child.log_path} ends: {_one_line(tail(child.log_path))}")
            if ready():
                return
            time.sleep(0.2)
        raise UserError(f"{child.name} not ready after {timeout:.0f} s; its log {child.log_path} ends: "
                        f"{_one_line(tail(child.log_path))}")

    def crashed(self) -> list[Child]:
        return [c for c in self.children if not c.running()]

    def stop_all(self, grace: float = 8.0) -> None:
        """SIGTERM every group at once, wait up to `grace` seconds in all, then SIGKILL the rest.

        A second Ctrl-C while this runs is ignored: cleanup must finish, or children would be left.
        """
        main = threading.current_thread() is threading.main_thread()  # signals are main-thread only
        previous = ({s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
                    if main else {})
        try:
            polite = [c for c in self.children if c.interrupt_first and c.running()]
            for child in polite:
                child.signal_group(signal.SIGINT)
            deadline = time.monotonic() + min(grace, 3.0)
            for child in polite:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            running = [c for c in reversed(self.children) if c.running()]
            for child in running:
                child.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for child in running:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            for child in self.children:
                child.stop(grace=grace)  # SIGKILLs what is left of each group
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _write_pids(self) -> None:
        # Lets a test (or a person) check afterwards that nothing the demo started is left.
        pids = {c.name: c.pid for c in self.children}
        (self.log_dir / "pids.json").write_text(json.dumps(pids, indent=1) + "\n")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-3:]) if lines else "(empty)"


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP to the demo stop it like Ctrl-C does, so the children are stopped too.

    SIGINT is set too: a shell starts background jobs with SIGINT ignored, and Python then keeps
    ignoring it, so `kill -INT` (what a supervisor or a test sends) would do nothing.
    """
    def _raise(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

