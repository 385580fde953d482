"""scripts/resume_check.py: one save of a real run, resumed several times with busy processes
beside it, is bit for bit every time (the promise of docs/checkpoints.md on one CPU rank), and
the check sees a resume that computes something else (a changed LR) as differing."""

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_save_resumes_bit_for_bit_every_time_under_load(
    tmp_path: Path, corpus_cache: Path
) -> None:
    run_dir = tmp_path / "run"
    train = [sys.executable, "train.py", *TINY, "train.steps=6", "train.checkpoint_every=3",
             "train.checkpoint_keep=2", f"data.cache_dir={corpus_cache}",
             f"hydra.run.dir={run_dir}"]  # fmt: skip
    done = subprocess.run(train, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    check = [sys.executable, "-m", "scripts.resume_check", str(run_dir), "--step", "3"]
    out = subprocess.run(
        [*check, "--times", "3", "--load", "1"], cwd=REPO, capture_output=True, text=True,
        timeout=800,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    assert "3 of 3 resumes bit for bit (1 busy process beside)" in out.stdout, out.stdout
    # The control: an LR the run did not have changes the update of step 4, so the loss of
    # step 5 (step 4's is the saved parameters', which the LR does not touch)
    changed = subprocess.run(
        [*check, "--times", "1", "--with", "optim.muon.lr=0.05"], cwd=REPO, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert changed.returncode == 1, changed.stdout + changed.stderr[-3000:]
    assert "differs from step 5" in changed.stdout, changed.stdout
