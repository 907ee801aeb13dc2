"""Under CI=true a skip is a failure: whatever a test needs, `make test` installs, so a skip there
means a missing dependency. These hooks (imported by tests/conftest.py) catch every skip:
tests/helpers.require, pytest.importorskip, skipif and whatever skip is added later."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.helpers import IN_CI


def _fail_a_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not IN_CI or not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped under CI=true, where a missing dependency is a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    _fail_a_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, Any, None]:
    outcome = yield
    _fail_a_skip(outcome.get_result())
