"""Fixtures shared across test modules, and how the suite shares two CPU cores.

The suite runs under pytest-xdist (`-n 2`, README): each worker process runs its tests with
one torch thread, so two workers use the two cores without oversubscribing them (a test that
spawns ranks gives each rank one thread too). The sample corpus is built once per session
and shared by the workers.
"""

from pathlib import Path

import pytest
import torch
from filelock import FileLock


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: one core of its own
        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def corpus_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One sample-corpus cache for every end-to-end run of the session, built once: under
    xdist the workers share it (the first builds it, the others wait for the lock)."""
    from data.corpus.sample import build_sample_corpus

    root = tmp_path_factory.getbasetemp()
    if root.name.startswith("popen-gw"):  # an xdist worker's own directory: share its parent
        root = root.parent
    path = root / "corpus-cache"
    with FileLock(str(path) + ".lock"):
        path.mkdir(exist_ok=True)
        build_sample_corpus(path, progress=False)
    return path
