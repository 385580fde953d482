"""Other work on a shared machine, made on purpose: processes that each keep one core busy
with matrix products while a measurement runs (scripts/resume_check.py, scripts/bench/load.py)."""

import multiprocessing as mp
import time
from collections.abc import Iterator
from contextlib import contextmanager


def spin(seconds: float) -> None:
    """Keep one core busy with products until `seconds` have passed."""
    import numpy as np

    a = np.random.default_rng(0).random((256, 256))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = a @ a
        a /= np.abs(a).max()  # keep the values finite, whatever the number of products


@contextmanager
def busy_processes(n: int) -> Iterator[None]:
    """`n` busy processes for the duration of the block (none for n = 0)."""
    # Daemons with a day's bound: they end with the block, or with this process if it dies
    procs = [mp.Process(target=spin, args=(24 * 3600,), daemon=True) for _ in range(n)]
    for proc in procs:
        proc.start()
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join()
