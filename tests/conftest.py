"""Fixtures shared across test modules."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sample-corpus cache for every end-to-end run of the session (built on first use)."""
    return tmp_path_factory.mktemp("corpus-cache")
