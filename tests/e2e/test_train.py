"""End to end: `train(cfg)` and `python train.py` on the sample corpus, on CPU."""

import json
import logging
import math
import subprocess
import sys
from pathlib import Path

import pytest

import trainer.session
from model.flops import matmul_params
from tests.helpers import TINY, compose_config
from tests.unit.test_flops import meta_gpt
from train import train
from trainer.config import to_config
from trainer.observe.console import format_step
from trainer.observe.provenance import code_version

REPO = Path(__file__).resolve().parents[2]


def run_train(run_dir: Path, cache: Path, *overrides: str) -> tuple[float, list[dict]]:
    cfg = compose_config([*TINY, f"run_dir={run_dir}", f"data.cache_dir={cache}", *overrides])
    final = train(cfg)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return final, [json.loads(line) for line in lines]


@pytest.mark.slow
def test_training_lowers_val_loss_and_writes_the_curve(tmp_path: Path, corpus_cache: Path) -> None:
    steps = 24
    final, records = run_train(
        tmp_path,
        corpus_cache,
        f"train.steps={steps}",
        "train.batch_size=4",
        "train.val_every=8",
        "train.val_tokens=1024",
        "train.checkpoint_at_end=true",
    )
    first = records[0]
    assert first["step"] == 0 and first["tokens"] == 0
    # The run names its code (in a git checkout): in the first line and in its checkpoint.
    meta = json.loads((tmp_path / "checkpoints" / "step_000024" / "meta.json").read_text())
    assert first.get("code") == meta.get("code") == code_version()
    assert all("code" not in r for r in records[1:])
    assert first["val_loss"] == pytest.approx(math.log(50304), abs=0.01)  # zero-init head
    steps_seen = [r["step"] for r in records]
    assert steps_seen == list(range(steps + 1))
    val_steps = [r["step"] for r in records if "val_loss" in r]
    assert val_steps == [0, 8, 16, 24]
    for r in records[1:]:
        assert {"train_loss", "lr_mult", "lr/muon", "lr/embed", "lr/head"} <= r.keys()
        assert {"tokens", "train_time_ms", "step_ms", "tokens_per_s"} <= r.keys()
        assert r["tokens"] == r["step"] * 4 * 64
    assert final == records[-1]["val_loss"]
    assert final < first["val_loss"] - 2.0, f"val loss only fell to {final:.3f}"
    times = [r["train_time_ms"] for r in records]
    assert times == sorted(times)


@pytest.mark.slow
def test_same_seed_gives_identical_losses(tmp_path: Path, corpus_cache: Path) -> None:
    _, a = run_train(tmp_path / "a", corpus_cache, "seed=3")
    _, b = run_train(tmp_path / "b", corpus_cache, "seed=3")
    _, c = run_train(tmp_path / "c", corpus_cache, "seed=4")

    def losses(records: list[dict]) -> list[tuple]:
        return [(r.get("train_loss"), r.get("val_loss")) for r in records]

    assert losses(a) == losses(b)
    assert losses(a) != losses(c)


@pytest.mark.slow
def test_adamw_only_runs(tmp_path: Path, corpus_cache: Path) -> None:
    final, records = run_train(tmp_path, corpus_cache, "optim=adamw")
    assert math.isfinite(final) and final < records[0]["val_loss"]


@pytest.mark.slow
def test_synthetic_data_runs_without_files(tmp_path: Path) -> None:
    final, _ = run_train(tmp_path, tmp_path / "no-cache", "data=synthetic")
    assert math.isfinite(final)
    assert not (tmp_path / "no-cache").exists()


def test_unwritable_run_dir_fails_before_work(tmp_path: Path, corpus_cache: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="run_dir"):
        run_train(blocker / "run", corpus_cache)


def test_val_budget_beyond_the_val_set_names_the_key(tmp_path: Path, corpus_cache: Path) -> None:
    with pytest.raises(ValueError, match="val_tokens"):
        run_train(tmp_path, corpus_cache, "train.val_tokens=10000000")
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
def test_cli_writes_one_hydra_run_directory(tmp_path: Path, corpus_cache: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "train.py",
        *TINY,
        "train.steps=2",
        f"data.cache_dir={corpus_cache}",
        f"hydra.run.dir={run_dir}",
    ]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    log = (run_dir / "train.log").read_text()
    assert "final val loss" in log and "step 2/2" in log


def test_cli_bad_override_fails_with_the_key(tmp_path: Path) -> None:
    cmd = [sys.executable, "train.py", "model.n_head=3", f"hydra.run.dir={tmp_path}/r"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    assert "model.n_embd (128) must be divisible by model.n_head (3)" in out.stderr
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_training_reports_mfu_from_the_batch_flops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """train() on a CPU given a peak: every step's MFU is its batch's FLOPs over its time."""
    monkeypatch.setattr(trainer.session, "peak_flops", lambda device: 1e12)
    cfg = compose_config([*TINY, "data=synthetic", f"run_dir={tmp_path}"])
    train(cfg)
    conf = to_config(cfg)
    t, d, layers = conf.train, conf.model.n_embd, conf.model.n_layer
    causal = t.batch_size * t.seq_len * (t.seq_len + 1) // 2
    n = matmul_params(meta_gpt(conf.model))
    step_flops = 6 * n * t.batch_size * t.seq_len + 12 * d * layers * causal
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert len(steps) == t.steps
    for r in steps:
        assert r["mfu"] == pytest.approx(step_flops / (r["step_ms"] / 1e3) / 1e12, rel=1e-5)
        assert f"mfu {r['mfu']:.1%}" in format_step(r, t.steps)


def test_a_run_that_repeats_its_data_says_so_before_and_when_it_wraps(
    tmp_path: Path, corpus_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Pieces of at most 2 tokens from the sample corpus's 96 training documents: a pass
    serves 128 tokens (one step of 2 × 64, the next step's buffers run out), so the plan warns
    before step 1 and every later step starts a new pass."""
    pieces = ["data.align=pieces", "data.max_piece_len=2"]
    with caplog.at_level(logging.INFO):
        _, records = run_train(tmp_path / "repeats", corpus_cache, *pieces)
    log = caplog.text
    planned = log.index("the run's 4 steps read 512 training tokens")
    assert "serves 128 per pass: the data wraps around at step 2 and is read 4.0 times" in log
    assert planned < log.index("step 1/4"), "warned before training"
    assert log.count("the training data wrapped around") == 3
    assert "pass 2 begins (epoch 1 in metrics.jsonl) after 128 distinct tokens" in log
    assert [r.get("epoch") for r in records] == [None, 0, 1, 2, 3]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        _, records = run_train(tmp_path / "enough", corpus_cache)  # the stream holds 4 steps
    assert "step 1/4" in caplog.text and "wrap" not in caplog.text
    assert [r.get("epoch") for r in records] == [None, 0, 0, 0, 0]
