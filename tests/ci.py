"""Tests that need an optional tool skip without it on a developer's machine, and fail in CI, where they must run."""

import os

import pytest

IN_CI = bool(os.environ.get("SAFE_STUDIO_CI"))
"""Set by .ci/run: every optional tool the tests use is installed there by scripts/setup.sh --tests."""


def skip_or_fail(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI must run these tests: {reason}")
    pytest.skip(reason)
