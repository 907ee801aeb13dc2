"""Stop the shared live stacks (tests/rules/live_stack.py) when the session ends, before the
interpreter shuts down the thread pools the simulator and the exporter serve from."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.rules.live_stack import close_all


@pytest.fixture(scope="session", autouse=True)
def _close_live_stacks() -> Iterator[None]:
    yield
    close_all()
