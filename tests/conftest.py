"""Shared fixtures. Real embedded models load once per test session (conversion is cached on disk)."""

import pytest

from safe_engine.compare import load_models


@pytest.fixture(scope="session")
def gemma():
    # load_models keeps one copy per process, so the CLI and the app under test reuse these.
    return load_models(["embedded:gemma-3-270m"])[0]


@pytest.fixture(scope="session")
def smollm():
    return load_models(["embedded:smollm2-135m-instruct"])[0]


@pytest.fixture(scope="session")
def embedded_pair(gemma, smollm):
    """The default order: Gemma drafts, SmolLM2 verifies."""
    return [gemma, smollm]
