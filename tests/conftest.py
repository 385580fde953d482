"""Fixtures shared across test modules, and how the suite shares two CPU cores.

The suite runs under pytest-xdist (`-n 2`, docs/tests.md): each worker process runs its tests with
one torch thread, so two workers use the two cores without oversubscribing them. Every
process a test starts (a `python train.py`, torchrun's or `dist.nproc`'s ranks) inherits
OMP_NUM_THREADS=1 and computes with one thread too: a CPU's kernels may sum in an order that
depends on the thread count, and runs the suite compares bit for bit must use the same one,
whatever the machine's core count. The sample corpus is built once per session and shared by
the workers.
"""

import os
from pathlib import Path

import pytest
import torch
from filelock import FileLock


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The slow runs first: the two workers then end on short tests, not one on a long run
    while the other waits (xdist's worksteal hands out the list in order)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_configure(config: pytest.Config) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"  # for the processes tests start
    torch.set_num_threads(1)  # an xdist worker: one core of its own; a plain run: the same


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
