"""Helpers for tests: finding external tools, with CI's rule that missing means failure."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "compose" / "specs"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
IN_CI = os.environ.get("CI", "").lower() == "true"


def require_binary(name: str) -> str:
    """Path of an external program; skip locally when it is missing, fail under CI=true."""
    path = shutil.which(name)
    if path is None:
        message = f"{name} is not installed (run `make test`, which installs it)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    return path


def require(condition: bool, message: str) -> None:
    """Skip locally, fail under CI=true, when a dependency of a test is missing."""
    if not condition:
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
