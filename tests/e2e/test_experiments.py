"""Experiments: sweeps (grid, Optuna), curve plots, the report's statistics, wandb, targets."""

import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from hydra import compose, initialize_config_dir
from scipy import stats

from scripts import plot_curves, report
from scripts.runs import find_runs, load_reference, reference_names
from tests.helpers import CONF_DIR, TINY, compose_config
from train import train
from trainer.config import register_configs
from trainer.launch.signals import Stopped

REPO = Path(__file__).resolve().parents[2]
QUICK = [*TINY, "train.steps=6", "train.val_every=3"]


def final_val(job: Path) -> float:
    lines = (job / "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["val_loss"] for x in lines if "val_loss" in json.loads(x)][-1]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_grid_sweep_and_its_report(tmp_path: Path, corpus_cache: Path) -> None:
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(REPO / "train.py"), "-m", *QUICK, "optim.muon.lr=0.01,0.04",
           "seed=range(2)", f"data.cache_dir={corpus_cache}",
           f"hydra.sweep.dir={sweep}"]  # fmt: skip
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=380)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert [j.name for j in jobs] == ["0", "1", "2", "3"]
    finals = {}
    for job in jobs:
        overrides = yaml.safe_load((job / ".hydra" / "overrides.yaml").read_text())
        lr = next(o for o in overrides if o.startswith("optim.muon.lr="))
        finals.setdefault(lr, []).append(final_val(job))
    assert all(len(v) == 2 for v in finals.values()) and len(finals) == 2
    best = min(v for losses in finals.values() for v in losses)
    summary = out.stdout.strip().splitlines()[-1]  # the sweep's last line says how it went
    assert summary.startswith("multirun done: 4 of 4 jobs finished; best final val loss"), summary
    assert f"{best:.4f}" in summary and f"scripts/report.py {sweep}" in summary, summary

    finished, unfinished = report.split_finished(find_runs([sweep]))
    assert len(finished) == 4 and not unfinished, "Hydra's config.yaml gives the planned steps"
    assert report.default_target(finished)[0] is None, "the sample corpus has no record target"
    target = statistics.fmean(finals["optim.muon.lr=0.04"]) + 0.05
    rows = {r["group"]: r for r in report.summarize(find_runs([sweep]), target)}
    assert set(rows) == set(finals), "grouped by lr, seeds pooled"
    for group, losses in finals.items():
        r = rows[group]
        assert r["n"] == 2
        assert r["mean"] == pytest.approx(statistics.fmean(losses))
        assert r["std"] == pytest.approx(statistics.stdev(losses))
        assert r["min"] == min(losses)
        assert r["margin_sqrt_n"] == pytest.approx((target - statistics.fmean(losses)) * 2**0.5)
        want_p = stats.ttest_1samp(losses, target, alternative="less").pvalue
        assert r["p_value"] == pytest.approx(want_p)
    assert rows["optim.muon.lr=0.04"]["reached"] >= 1
    table = report.render(list(rows.values()))
    assert "| optim.muon.lr=0.01 | 2 |" in table
    csv_rows = report.render(list(rows.values()), "csv").splitlines()
    assert csv_rows[0].startswith("group,n,mean") and len(csv_rows) == 3


def test_target_statistics_match_scipy() -> None:
    samples = [3.2791, 3.2770, 3.2802, 3.2765, 3.2781, 3.2779]
    p, margin = report.target_stats(samples, 3.28)
    want = stats.ttest_1samp(samples, 3.28, alternative="less")
    assert p == pytest.approx(want.pvalue, rel=1e-12)
    assert margin == pytest.approx((3.28 - np.mean(samples)) * math.sqrt(6))
    # By hand: t = (mean - target) / (s / sqrt(n)), p = P(T_{n-1} <= t).
    t = (np.mean(samples) - 3.28) / (np.std(samples, ddof=1) / math.sqrt(6))
    assert p == pytest.approx(stats.t.cdf(t, df=5))
    assert report.target_stats([3.27], 3.28) == (None, pytest.approx(0.01))
    assert report.target_stats([3.27, 3.27], 3.28)[0] == 0.0  # no spread: certainly below


def fake_run(root: Path, name: str, lr: str, losses: list[float]) -> Path:
    run = root / name
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(
        yaml.safe_dump([f"optim.muon.lr={lr}", "seed=0"])
    )
    records = [{"step": 0, "val_loss": losses[0], "tokens": 0, "train_time_ms": 0.0}]
    for i, loss in enumerate(losses[1:], 1):
        records.append({"step": i * 10, "train_loss": loss + 0.1, "val_loss": loss,
                        "tokens": i * 10 * 2048, "train_time_ms": i * 1000.0})  # fmt: skip
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    steps = records[-1]["step"]  # finished: the last record is at the planned step count
    (run / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"train": {"steps": steps}}))
    return run


def test_plot_draws_a_line_per_curve(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    fake_run(sweep, "0", "0.01", [10.8, 7.0, 6.5])
    fake_run(sweep, "1", "0.02", [10.8, 6.8, 6.2])
    runs = find_runs([sweep])
    ref = load_reference("modded_2024-11-06_shortcuts_tweaks")
    fig = plot_curves.plot(runs, [ref], x="tokens", train=True)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 + 2 + 1  # val and train per run, one reference
    labels = [line.get_label() for line in lines]
    assert labels[:2] == ["optim.muon.lr=0.01 val", "optim.muon.lr=0.01 train"]
    assert "modded_2024-11-06_shortcuts_tweaks (reference)" in labels
    assert list(lines[-1].get_xdata())[1] == 125 * 524_288  # tokens of the record's step 125
    assert list(lines[0].get_ydata()) == [10.8, 7.0, 6.5]
    out = tmp_path / "curves.png"
    assert plot_curves.main([str(sweep), "--reference", "all", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(reference_names()) == 8


def test_a_reference_with_its_own_tokens_per_step() -> None:
    record = load_reference("modded_2025-01-26_batchsize")
    assert record.tokens_per_step == 393_216 and record.records[-1]["step"] == 1770
    assert record.records[-1]["tokens"] == 1770 * 393_216
    assert record.final_val_loss() == pytest.approx(3.2808)


def test_record_2026_07_17_reference_is_its_log() -> None:
    """Record #89's curve (docs/records.md, record_2026_07_17): 1,390 steps, 365,690,880 tokens."""
    record = load_reference("modded_2026-07-17_fp8downprojection")
    assert record.records[-1]["step"] == 1390 and record.records[-1]["tokens"] == 365_690_880
    assert record.final_val_loss() == pytest.approx(3.2775)
    assert record.records[0]["val_loss"] == pytest.approx(10.8311)


def test_reference_curves_are_the_public_records() -> None:
    record = load_reference("modded_2024-11-06_shortcuts_tweaks")
    assert record.records[-1]["step"] == 3200
    assert record.final_val_loss() == pytest.approx(3.2791)
    assert record.time_to(3.28) == pytest.approx(493.742)
    source = (REPO / "scripts" / "reference" / "llmc_gpt2_124m_baseline.csv").read_text()
    assert source.startswith("# source: github.com/")


@pytest.mark.slow
def test_wandb_offline_logs_the_metrics_and_a_resume_continues_the_run(
    tmp_path: Path, corpus_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_SILENT", "true")
    overrides = [*QUICK, "logging=wandb", "logging.wandb.mode=offline",
                 f"data.cache_dir={corpus_cache}", f"run_dir={tmp_path}",
                 "train.checkpoint_every=3", "train.checkpoint_at_end=true"]  # fmt: skip
    with pytest.raises(Stopped):
        train(compose_config([*overrides, "train.fault.signal_at_step=3"]))
    final = train(compose_config(overrides))
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2, "one local run per attempt"
    ids = {r.name.rsplit("-", 1)[1] for r in runs}
    assert len(ids) == 1, "the resumed attempt logs to the same wandb run id"
    # The offline run log (protobuf records) holds every logged value as JSON text. wandb's
    # own service process writes it, and on a loaded machine it may still be writing when
    # finish() has returned: the values are read until all are there, for up to a minute.
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["val_loss"] == final and len(records) == 7
    want = {(rec["step"], key): json.dumps(rec[key]).encode()
            for rec in records for key in ("train_loss", "val_loss") if key in rec}  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        logged = b"".join(f.read_bytes() for r in runs for f in r.glob("run-*.wandb"))
        missing = [k for k, v in want.items() if v not in logged]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not missing, f"(step, key) not in the offline wandb log: {missing}"


@pytest.mark.slow
def test_wandb_disabled_needs_no_account(
    tmp_path: Path, corpus_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing there
    cfg = compose_config([*QUICK, "logging=wandb", "logging.wandb.mode=disabled",
                          f"data.cache_dir={corpus_cache}", f"run_dir={tmp_path}"])  # fmt: skip
    assert math.isfinite(train(cfg))
    assert not (tmp_path / "wandb").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_optuna_preset_runs_two_trials(tmp_path: Path, corpus_cache: Path) -> None:
    sweep = tmp_path / "optuna"
    cmd = [sys.executable, str(REPO / "train.py"), "-m", "hparams_search=optuna",
           "hydra.sweeper.n_trials=2", *QUICK, f"data.cache_dir={corpus_cache}",
           f"hydra.sweep.dir={sweep}"]  # fmt: skip
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=380)
    assert out.returncode == 0, out.stderr[-3000:]
    jobs = sorted(p for p in sweep.iterdir() if p.is_dir() and p.name.isdigit())
    assert len(jobs) == 2
    lrs = {yaml.safe_load((j / ".hydra" / "overrides.yaml").read_text())[0] for j in jobs}
    assert len(lrs) == 2, "the trials tried different values"
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == pytest.approx(min(final_val(j) for j in jobs))


@pytest.mark.slow
def test_target_val_loss_stops_the_run_and_reports_the_time(
    tmp_path: Path, corpus_cache: Path
) -> None:
    overrides = [*TINY, "train.steps=40", "train.val_every=2", "train.target_val_loss=9.5",
                 f"data.cache_dir={corpus_cache}", f"run_dir={tmp_path}",
                 "train.checkpoint_at_end=true"]  # fmt: skip
    final = train(compose_config(overrides))
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert last.get("target_reached") and last["val_loss"] == final <= 9.5
    assert last["step"] < 40
    assert all(r["val_loss"] > 9.5 for r in records[:-1] if "val_loss" in r)
    assert find_runs([tmp_path])[0].time_to(9.5) == pytest.approx(last["train_time_ms"] / 1000)
    assert train(compose_config(overrides)) == final, "a rerun finds the target reached"
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == len(records)


def test_slurm_preset_wires_gpus_to_ranks() -> None:
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["launcher=slurm", "dist.nproc=4",
                      "run_dir=."], return_hydra_config=True)  # fmt: skip
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.gpus_per_node == cfg.dist.nproc == 4
    assert launcher.tasks_per_node == 1


def test_speedrun_124m_is_the_record_2024_11_06_preset() -> None:
    """speedrun_124m is the old name of record_2024_11_06: the same config, key for key
    (the preset's values against docs/records.md: tests/unit/test_record_presets.py)."""
    alias = compose_config(["experiment=speedrun_124m", "run_dir=."])
    record = compose_config(["experiment=record_2024_11_06", "run_dir=."])
    assert alias == record
    assert os.path.basename(alias.data.dir) == "fineweb10B"
