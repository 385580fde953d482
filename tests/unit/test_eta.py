"""The ETA follows the batch stages, and the time to a target loss comes from a reference curve
matched by tokens. References: arithmetic by hand on the stage table and on small curves."""

import json
import logging
import math
from pathlib import Path

import pytest

from stages import Stage, StageTable
from tests.helpers import TINY, compose_config
from train import train
from trainer.config import TrainConfig
from trainer.observe.console import run_summary
from trainer.observe.metrics import step_rates
from trainer.observe.progress import Progress
from trainer.reference import ReferenceConfig, load_curve, misfit, run_facts, target_eta_s
from trainer.runtime import init_runtime

CURVE = "step,val_loss,tokens\n0,10.0,0\n1,5.0,100\n2,4.0,200\n3,3.0,300\n"


def curve_file(tmp_path: Path, text: str = CURVE) -> str:
    path = tmp_path / "curve.csv"
    path.write_text("# a hand-made curve\n" + text)
    return str(path)


def test_the_eta_counts_the_tokens_left_by_stage() -> None:
    """30 steps in three stages of 64, 128 and 192 tokens per sequence (2 sequences a step):
    10 s for the first 10 steps (1,280 tokens) leaves 2·(10·128 + 10·192) = 6,400 tokens,
    50 s at that rate, where the mean step would say 20 s."""
    stages = StageTable(rows=[Stage(seq_len=n) for n in (64, 128, 192)])
    t = TrainConfig(steps=30, batch_size=2, seq_len=192, stages=stages)
    p = Progress(step=10, tokens=1_280, train_time_s=10.0)
    rates = step_rates(p, t, init_runtime("cpu", "none"), 1.0, None, None)
    assert rates["eta_s"] == pytest.approx(50.0)
    warm = TrainConfig(steps=30, batch_size=2, seq_len=192, stages=stages, untimed_steps=2)
    # The first 2 steps (256 tokens) are not in the train time: 10 s for 1,024 tokens.
    assert step_rates(p, warm, init_runtime("cpu", "none"), 1.0, None, None)[
        "eta_s"
    ] == pytest.approx(10 / 1_024 * 6_400)


def test_a_curve_is_read_and_interpolated_by_tokens(tmp_path: Path) -> None:
    curve = load_curve(curve_file(tmp_path))
    assert curve.tokens_at(4.5) == 150 and curve.tokens_at(3.5) == 250
    assert curve.tokens_at(11.0) == 0 and curve.tokens_at(2.0) is None
    assert curve.tokens_to(3.5, 4.5) == 100 and curve.tokens_to(3.5, 3.4) == 0
    assert curve.loss_at_tokens(50) == 7.5 and curve.loss_at_tokens(10_000) == 3.0
    assert target_eta_s(curve, 3.5, 4.5, 0.01) == pytest.approx(1.0)
    assert target_eta_s(curve, 2.0, 4.5, 0.01) is None, "the curve never got there"


def test_the_records_curves_read_as_their_logs_say() -> None:
    """Record #89's curve gives its tokens (131,072 a step before step 460); #9's has none, so
    step × 524,288; each record preset names its record's curve."""
    d = load_curve("modded_2026-07-17_fp8downprojection")
    assert (d.steps[1], d.tokens[1], d.val_loss[1]) == (250, 250 * 131_072, 4.4888)
    assert d.tokens_at((10.8311 + 4.4888) / 2) == pytest.approx(125 * 131_072)
    a = load_curve("modded_2024-11-06_shortcuts_tweaks")
    assert a.tokens[1] == a.steps[1] * 524_288 and a.tokens_per_step == 524_288
    assert d.tokens_at(3.28) is not None and a.tokens_at(3.28) is not None
    for preset in ("record_2024_11_06", "record_2025_01_26", "record_2025_11_29",
                   "record_2026_07_17"):  # fmt: skip
        curve = load_curve(compose_config([f"experiment={preset}"]).train.reference.curve)
        # #21's logged run ended at 3.2808: no time to 3.28 from it, the others reach it
        assert (curve.tokens_at(3.28) is None) == (preset == "record_2025_01_26"), preset


def test_a_bad_curve_is_named_before_work(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"train\.reference\.curve='nope': no such curve"):
        ReferenceConfig(curve="nope").validate()
    with pytest.raises(ValueError, match=r"train\.reference\.target must be positive"):
        ReferenceConfig(target=0).validate()
    with pytest.raises(ValueError, match="2 or more evaluations in token order"):
        load_curve(curve_file(tmp_path, "step,val_loss,tokens\n0,10.0,0\n1,5.0,0\n"))


def test_a_run_logs_the_reference_and_its_time_to_target(
    tmp_path: Path, corpus_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tiny run against a curve that falls from 11 to 3 over 512 tokens (two of its steps):
    every evaluation after step 0 gives the curve's loss at the run's tokens and a time."""
    curve = curve_file(tmp_path, "step,val_loss,tokens\n0,11.0,0\n2,3.0,512\n")
    overrides = [*TINY, f"run_dir={tmp_path / 'run'}", f"data.cache_dir={corpus_cache}",
                 f"train.reference.curve={curve}", "train.reference.target=3.5"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        train(compose_config(overrides))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    evals = [r for r in map(json.loads, lines) if "val_loss" in r]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert evals[0]["reference_val_loss"] == 11.0 and "target_eta_s" not in evals[0]
    for r in evals[1:]:  # 128 tokens a step: the curve's loss at step s is 11 − 8·s·128/512
        assert r["reference_val_loss"] == pytest.approx(11 - 2 * r["step"])
        per_token = r["train_time_ms"] / 1e3 / r["tokens"]
        more = (11 - 3.5) / 8 * 512 - (11 - min(r["val_loss"], 11)) / 8 * 512
        assert math.isclose(r["target_eta_s"], more * per_token, rel_tol=1e-9)
    assert "reference 7.0000" in caplog.text and "to target ~" in caplog.text


RECORDS = ("record_2024_11_06", "record_2025_01_26", "record_2025_11_29", "record_2026_07_17",
           "record_medium_2025_12_31")  # fmt: skip


def test_a_record_curve_fits_its_preset_alone() -> None:
    """Each record preset at its own size on FineWeb fits its curve; the same preset at toy
    width, at another depth or on the sample corpus does not, and the reason names the keys."""
    for preset in RECORDS:
        conf = compose_config([f"experiment={preset}"])
        curve = load_curve(conf.train.reference.curve)
        assert dict(curve.run)["data"] == "fineweb", preset  # each built-in curve says its run
        assert misfit(curve, run_facts(conf.data, conf.model)) is None, preset
        toy = compose_config([f"experiment={preset}", "model.n_embd=64", "data=sample"])
        why = misfit(curve, run_facts(toy.data, toy.model))
        assert why is not None and "data=sample" in why and "n_embd=64" in why, (preset, why)
        deeper = compose_config([f"experiment={preset}", f"model.n_layer={conf.model.n_layer + 1}"])
        assert "n_layer=" in (misfit(curve, run_facts(deeper.data, deeper.model)) or ""), preset


def test_a_curve_with_a_bad_run_line_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "curve.csv"
    path.write_text("# run: data=fineweb twelve\n" + CURVE)
    with pytest.raises(ValueError, match="key=value pairs"):
        load_curve(str(path))


def test_a_run_unlike_the_curve_is_not_shown_it(
    tmp_path: Path, corpus_cache: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The tiny run on the sample corpus with record #9's FineWeb curve: no reference loss and
    no time to target in its records or console, and one line saying why."""
    overrides = [*TINY, f"run_dir={tmp_path / 'run'}", f"data.cache_dir={corpus_cache}",
                 "train.reference.curve=modded_2024-11-06_shortcuts_tweaks"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        train(compose_config(overrides))
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(x) for x in lines]
    assert not any("reference_val_loss" in r or "target_eta_s" in r for r in records)
    assert "| reference " not in caplog.text and "to target ~" not in caplog.text
    assert "is not shown" in caplog.text and "data=sample" in caplog.text


def test_the_summary_gives_the_train_time_or_says_why_not() -> None:
    """A run inside the records' untimed warm-up says so, with the time those steps took."""
    short = Progress(step=3, tokens=96, val_loss=9.0, untimed_s=4.2)
    line = run_summary(short, untimed_steps=10)
    assert "not measured: all 3 steps are within train.untimed_steps=10" in line
    assert "3 untimed steps took 4.2s" in line
    long = Progress(step=12, tokens=384, train_time_s=2.0, val_loss=8.0, untimed_s=4.2)
    assert "train time 2.0s (1000 ms/step) (10 untimed steps took 4.2s)" in run_summary(long, 10)
    assert run_summary(Progress(step=4, train_time_s=2.0, val_loss=8.0), 0).endswith(
        "train time 2.0s (500 ms/step)"
    )


def test_progress_keeps_the_untimed_steps_apart() -> None:
    p = Progress()
    p.advance(10, 3.0, timed=False)
    p.advance(10, 1.0, timed=True)
    assert (p.train_time_s, p.untimed_s, p.step, p.tokens) == (1.0, 3.0, 2, 20)
