"""A run that fails before it starts leaves no directory behind, and nothing else is ever
removed: a directory with a record, a checkpoint, a file of the user's, or from before this
launch stays."""

import os
import time
from pathlib import Path

from trainer.run_dir import discard_unstarted


def startup_dir(root: Path) -> Path:
    """What Hydra and the trainer write before a run's first record."""
    run = root / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("train: {}\n")
    (run / "train.log").write_text("error: ...\n")
    (run / "checkpoints").mkdir()
    return run


def test_a_run_that_never_started_is_removed(tmp_path: Path) -> None:
    since = time.time() - 1
    run = startup_dir(tmp_path)
    assert discard_unstarted(run, since) and not run.exists()


def test_anything_more_keeps_the_directory(tmp_path: Path) -> None:
    since = time.time() - 1
    for name, make in [
        ("metrics.jsonl", lambda run: (run / "metrics.jsonl").write_text("{}\n")),
        ("a checkpoint", lambda run: (run / "checkpoints" / "step_000001").mkdir()),
        ("a user's file", lambda run: (run / "notes.txt").write_text("mine")),
    ]:
        root = tmp_path / name
        run = startup_dir(root)
        make(run)
        assert not discard_unstarted(run, since), name
        assert (run / "train.log").is_file(), name


def test_a_directory_from_before_this_launch_stays(tmp_path: Path) -> None:
    run = startup_dir(tmp_path)
    old = time.time() - 3600
    for p in [run, *run.iterdir()]:
        os.utime(p, (old, old))
    assert not discard_unstarted(run, time.time() - 1)
    assert run.is_dir()
    assert not discard_unstarted(tmp_path / "missing", 0.0)
