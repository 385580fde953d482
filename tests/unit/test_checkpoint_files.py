"""The on-disk checkpoint layout: atomic saves, `latest`, keep-K, damaged saves passed over."""

import errno
import json
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import files as checkpoint
from trainer.checkpoint.files import CheckpointError


def parts(value: float) -> dict:
    return {
        "model": {"w": torch.full((4, 4), float(value))},
        "optimizers": [{"state": {}, "param_groups": []}],
        "trainer": {"progress": {"step": int(value)}},
    }


def save(root: Path, step: int, keep: int = 3) -> Path:
    return checkpoint.save(root, step, parts(step), {"world_size": 1}, keep)


def test_save_then_load_round_trip(tmp_path: Path) -> None:
    path = save(tmp_path, 7)
    assert path == tmp_path / "step_000007"
    assert (tmp_path / "latest").read_text().strip() == "step_000007"
    loaded = checkpoint.load(path)
    assert loaded.meta["step"] == 7 and loaded.meta["world_size"] == 1
    assert loaded.meta["format_version"] == checkpoint.FORMAT_VERSION
    torch.testing.assert_close(loaded.parts["model"]["w"], torch.full((4, 4), 7.0))
    assert loaded.parts["trainer"]["progress"]["step"] == 7
    assert not list(tmp_path.glob(".tmp-*")), "no temporary files left behind"


def test_keep_the_newest_k(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        save(tmp_path, step, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000030", "step_000040"]
    assert checkpoint.find_latest(tmp_path) == tmp_path / "step_000040"


def test_keep_counts_save_order_not_step(tmp_path: Path) -> None:
    """After resuming from step 20 of a run that reached 40, the new saves are the newest."""
    for step in (20, 40):
        save(tmp_path, step, keep=2)
    save(tmp_path, 25, keep=2)
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_000025", "step_000040"]
    assert checkpoint.find_latest(tmp_path) == tmp_path / "step_000025"


def test_a_save_interrupted_midway_is_ignored(tmp_path: Path) -> None:
    good = save(tmp_path, 10)
    # A kill while writing step 20: its temporary directory holds a truncated file.
    tmp = tmp_path / ".tmp-step_000020-12345"
    tmp.mkdir()
    (tmp / "model.pt").write_bytes(b"PK\x03\x04 truncated")
    assert checkpoint.find_latest(tmp_path) == good
    assert checkpoint.resolve("auto", tmp_path.parent) is None  # not the run dir's checkpoints/
    save(tmp_path, 30)
    assert not tmp.exists(), "the next save removes the abandoned temporary directory"


def test_a_truncated_file_in_the_newest_save_falls_back(tmp_path: Path) -> None:
    good = save(tmp_path, 10)
    bad = save(tmp_path, 20)
    model = bad / "model.pt"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    assert (tmp_path / "latest").read_text().strip() == bad.name
    assert checkpoint.find_latest(tmp_path) == good
    with pytest.raises(CheckpointError, match=r"model\.pt is corrupt.*says \d+ bytes, the file"):
        checkpoint.load(bad)


def test_corrupt_bytes_of_the_right_size_fail_to_load_with_the_file(tmp_path: Path) -> None:
    path = save(tmp_path, 10)
    f = path / "optimizers.pt"
    f.write_bytes(b"\0" * f.stat().st_size)
    with pytest.raises(CheckpointError, match=r"optimizers\.pt is corrupt or unreadable"):
        checkpoint.load(path)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: (p / "meta.json").unlink(), "not a complete checkpoint: it has no meta.json"),
        (lambda p: (p / "meta.json").write_text("{"), "meta.json is unreadable"),
        (lambda p: (p / "trainer.pt").unlink(), r"trainer\.pt is corrupt: .* is missing"),
        (
            lambda p: (p / "meta.json").write_text(json.dumps({"format_version": 99})),
            "format version 99; this code reads 1",
        ),
    ],
)
def test_damaged_checkpoints_are_named(tmp_path: Path, damage, message: str) -> None:
    path = save(tmp_path, 10)
    damage(path)
    with pytest.raises(CheckpointError, match=message):
        checkpoint.validate(path)
    assert checkpoint.find_latest(tmp_path) is None


def test_disk_full_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch) -> None:
    good = save(tmp_path, 10)
    real_save = torch.save

    def fill_disk(obj, f) -> None:  # writes a little, then the disk is full
        real_save({"x": torch.zeros(10)}, f)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", fill_disk)
    with pytest.raises(OSError, match="No space left"):
        save(tmp_path, 20)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_000010"]
    assert checkpoint.find_latest(tmp_path) == good
    checkpoint.load(good)


def test_resolve_paths(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert checkpoint.resolve("auto", run) is None
    assert checkpoint.resolve("never", run) is None
    root = run / checkpoint.CHECKPOINTS_DIR
    save(root, 5)
    newest = save(root, 9)
    assert checkpoint.resolve("auto", run) == newest
    assert checkpoint.resolve("never", run) is None
    assert checkpoint.resolve(str(root / "step_000005"), tmp_path) == root / "step_000005"
    assert checkpoint.resolve(str(root), tmp_path) == newest
    assert checkpoint.resolve(str(run), tmp_path) == newest


def test_resolve_bad_paths_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"train.resume=.*does not exist"):
        checkpoint.resolve(str(tmp_path / "nope"), tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match=r"train.resume=.*is not a checkpoint"):
        checkpoint.resolve(str(tmp_path / "empty"), tmp_path)
    bad = save(tmp_path / "c", 3)
    (bad / "model.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"model\.pt is corrupt"):
        checkpoint.resolve(str(bad), tmp_path)  # an explicit path is never swapped for another
