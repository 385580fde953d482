"""A resume that cannot continue is refused before any work, naming what to fix; a save that
fails keeps the last good checkpoint; an older version's save still resumes."""

import json
import math
from pathlib import Path

import pytest
import torch

from model.config.moved import MOVED, RESHAPED
from tests.e2e.test_resume import run
from trainer.checkpoint import files as checkpoint
from trainer.checkpoint.files import CheckpointError


def test_incompatible_model_names_the_keys(tmp_path: Path, corpus_cache: Path) -> None:
    source = tmp_path / "source"
    run(source, corpus_cache, "train.steps=2", "train.val_every=1")
    saved = sorted(p.stat().st_mtime_ns for p in source.rglob("*"))
    target = tmp_path / "target"
    with pytest.raises(CheckpointError, match=r"model\.n_embd: 64 saved, 128 now"):
        run(target, corpus_cache, "model.n_embd=128", f"train.resume={source}")
    assert sorted(p.stat().st_mtime_ns for p in source.rglob("*")) == saved, "source touched"
    assert not (target / "metrics.jsonl").exists()


def test_bad_resume_paths_fail_before_training(tmp_path: Path, corpus_cache: Path) -> None:
    with pytest.raises(CheckpointError, match=r"train\.resume=.*does not exist"):
        run(tmp_path / "a", corpus_cache, f"train.resume={tmp_path / 'missing'}")
    (tmp_path / "not-a-checkpoint").mkdir()
    with pytest.raises(CheckpointError, match="is not a checkpoint"):
        run(tmp_path / "b", corpus_cache, f"train.resume={tmp_path / 'not-a-checkpoint'}")
    source = tmp_path / "source"
    run(source, corpus_cache, "train.steps=2", "train.val_every=1")
    model = source / "checkpoints" / "step_000002" / "model.pt"
    model.write_bytes(b"\0" * model.stat().st_size)
    with pytest.raises(CheckpointError, match=r"model\.pt is corrupt or unreadable"):
        run(tmp_path / "c", corpus_cache, f"train.resume={source}")
    for name in "abc":
        assert not (tmp_path / name / "metrics.jsonl").exists()


def test_unwritable_checkpoint_directory_fails_first(tmp_path: Path, corpus_cache: Path) -> None:
    (tmp_path / "checkpoints").write_text("a file where the directory should be")
    with pytest.raises(PermissionError, match="checkpoints"):
        run(tmp_path, corpus_cache)
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_disk_full_during_a_save_keeps_the_last_checkpoint(
    tmp_path: Path, corpus_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_save, calls = torch.save, []

    def full_on_second_save(obj, f) -> None:
        calls.append(1)
        if len(calls) > 3:  # three files per checkpoint: the second checkpoint fails
            f.write(b"partial")
            raise OSError(28, "No space left on device")
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", full_on_second_save)
    with pytest.raises(OSError, match=r"checkpoint of step 10 .* No space left on device.*"
                       r"last good checkpoint is .*step_000005"):  # fmt: skip
        run(tmp_path, corpus_cache)
    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000005"]
    checkpoint.load(root / "step_000005")


def test_a_checkpoint_from_before_a_new_option_resumes(tmp_path: Path, corpus_cache: Path) -> None:
    """An older version's save (model keys flat, keys added since missing) takes each missing
    key at its default: it resumes, and a run that turns such an option on is refused."""
    source = tmp_path / "source"
    run(source, corpus_cache, "train.steps=2", "train.val_every=1")
    meta_file = source / "checkpoints" / "step_000002" / "meta.json"
    meta = json.loads(meta_file.read_text())
    model = meta["config"]["model"]
    # the flat schema's layout (groups then hold new keys only); its one gated skip's two keys
    pair = (model["residual"].pop("skips") or [[-1, -1]])[0]
    for old, new in MOVED.items():
        group, key = new.split(".")
        model[old] = pair[("skip_from", "skip_to").index(key)] if new in RESHAPED else (
            model[group].pop(key)
        )  # fmt: skip
    for group in {new.split(".")[0] for new in MOVED.values()}:
        model.pop(group)  # what is left (the sublayer scales) is newer than the flat schema
    del model["unet"], model["window"], meta["config"]["train"]["untimed_steps"]
    meta_file.write_text(json.dumps(meta))
    assert math.isfinite(
        run(tmp_path / "a", corpus_cache, "train.steps=3", f"train.resume={source}")
    )
    with pytest.raises(CheckpointError, match=r"model\.residual\.unet: False saved, True now"):
        run(tmp_path / "b", corpus_cache, "model.residual.unet=true", f"train.resume={source}")
