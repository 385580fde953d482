"""The test harness's rank pool (tests/dist_utils.py): a job whose rank is killed by a signal
runs once more in fresh processes, and only such a job; the retry hides neither a second crash
nor a Python error."""

import os
from pathlib import Path

import pytest
import torch.distributed as dist

from tests.dist_utils import RankCrashed, run_ranks


def _tally(out: str, rank: int) -> int:
    """Appends this call to rank's tally in `out`; how many calls it had before."""
    path = Path(out) / f"calls.{rank}"
    before = len(path.read_text().splitlines()) if path.exists() else 0
    with path.open("a") as f:
        f.write("call\n")
    return before


def _crash_first(rank: int, world: int, out: str, always: bool) -> None:
    before = _tally(out, rank)
    # Both ranks have counted this call before rank 0 dies: a loaded machine may otherwise
    # kill rank 0 while rank 1 is still joining the group, and rank 1's call never happens
    dist.barrier()
    if (before == 0 or always) and rank == 0:
        os.abort()  # SIGABRT, as glibc's heap check does


def _python_error(rank: int, world: int, out: str) -> None:
    _tally(out, rank)
    raise ValueError("a test's own failure")


def calls(out: Path) -> list[int]:
    return [len((out / f"calls.{r}").read_text().splitlines()) for r in range(WORLD)]


# Two ranks, as every multi-rank test: a crash of rank 0 leaves rank 1 waiting in a collective
WORLD = 2


@pytest.mark.timeout(120)
def test_a_crashed_job_runs_once_more_and_only_a_crash(
    tmp_path: Path, capfd: pytest.CaptureFixture
) -> None:
    once, twice, error = (tmp_path / n for n in ("once", "twice", "error"))
    for d in (once, twice, error):
        d.mkdir()
    run_ranks(_crash_first, 2, str(once), False)
    assert calls(once) == [2, 2]
    assert "a rank crashed in _crash_first" in capfd.readouterr().err
    with pytest.raises(RankCrashed, match="exit code -6"):
        run_ranks(_crash_first, 2, str(twice), True)
    assert calls(twice)[0] == 2
    with pytest.raises(RuntimeError, match="a test's own failure") as failed:
        run_ranks(_python_error, 2, str(error))
    assert not isinstance(failed.value, RankCrashed)
    assert calls(error) == [1, 1]
