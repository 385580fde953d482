"""The record presets at toy size: they train, give the same curve on 1 and 2 ranks, resume
exactly, and the toy command of README.md and docs/speedruns.md runs as written."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.dist_utils import run_torchrun_ranks
from tests.helpers import compose_config
from train import train
from trainer.launch.signals import Stopped

REPO = Path(__file__).resolve().parents[2]
# Each preset at its toy size (`size=toy`: conf/size/toy.yaml, conf/preset_size/toy/), with
# what a test adds: the CPU, no periodic saves, a timeout for the ranks
TOY = ["size=toy", "train.device=cpu", "train.checkpoint_every=0", "dist.timeout_s=60"]
RECORDS = ["record_2024_11_06", "record_2025_01_26"]  # the 2025-11 record: its own test below


def curve(run_dir: Path) -> list[tuple]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r.get("train_loss"), r.get("val_loss")) for r in records]


def run(run_dir: Path, cache: Path, *overrides: str) -> float:
    cfg = compose_config([*TOY, *overrides, f"run_dir={run_dir}", f"data.cache_dir={cache}"])
    return train(cfg)


def _rank_job(rank: int, world: int, run_dir: str, overrides: list[str], cache: str) -> None:
    run(Path(run_dir), Path(cache), *overrides)


@pytest.fixture(scope="module", params=RECORDS)
def straight(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
             corpus_cache: Path) -> tuple[str, list[tuple]]:  # fmt: skip
    """Each preset's uninterrupted one-rank curve, the reference of both tests below."""
    record, one = request.param, tmp_path_factory.mktemp(request.param) / "one"
    run(one, corpus_cache, f"experiment={record}")
    return record, curve(one)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_record_preset_same_curve_on_one_and_two_ranks(
    straight: tuple[str, list[tuple]], tmp_path: Path, corpus_cache: Path
) -> None:
    record, a = straight
    two = tmp_path / "two"
    overrides = [f"experiment={record}"]
    run_torchrun_ranks(_rank_job, 2, str(two), overrides, str(corpus_cache))
    b = curve(two)
    assert [r[0] for r in a] == [r[0] for r in b] == list(range(7))
    for (step, train_a, val_a), (_, train_b, val_b) in zip(a, b, strict=True):
        for x, y in ((train_a, train_b), (val_a, val_b)):
            assert (x is None) == (y is None), step
            assert x is None or x == pytest.approx(y, abs=1e-3), (step, x, y)
    assert a[-1][2] < a[0][2] - 0.1, "it trains"  # in 6 toy steps: 10.83 -> 10.64 (A)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_record_preset_resumes_exactly(
    straight: tuple[str, list[tuple]], tmp_path: Path, corpus_cache: Path
) -> None:
    """Stopped after step 5 and resumed: every loss of the uninterrupted run, bit for bit
    (the window schedule, the FP8 head and the bf16 tables included)."""
    record, want = straight
    saving = [f"experiment={record}", "train.checkpoint_at_end=true"]
    resumed = tmp_path / "resumed"
    with pytest.raises(Stopped):
        run(resumed, corpus_cache, *saving, "train.fault.signal_at_step=5")
    run(resumed, corpus_cache, *saving)
    assert curve(resumed) == want


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_record_2025_11_29_toy_resumes_from_an_even_step(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """The 2025-11 record at toy size through its three batch phases (one uninterrupted run,
    the reference): a resume from the save after update 4, an even step whose gradient Adam
    holds until update 5, bit for bit. Two ranks through the same phases, packed pieces and
    odd-step Adam: record_2026_07_17's test below; each rank's NorMuon against one process's:
    tests/e2e/test_dist_muon.py."""
    preset = ["experiment=record_2025_11_29"]
    run(tmp_path / "one", corpus_cache, *preset)
    want = curve(tmp_path / "one")
    assert [r[0] for r in want] == list(range(9)) and want[-1][2] < want[0][2] - 0.3
    saving = [*preset, "train.checkpoint_at_end=true"]
    with pytest.raises(Stopped):
        run(tmp_path / "resumed", corpus_cache, *saving, "train.fault.signal_at_step=5")
    run(tmp_path / "resumed", corpus_cache, *saving)
    assert curve(tmp_path / "resumed") == want


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_pages_toy_command_runs_as_written(tmp_path: Path) -> None:
    """`python train.py experiment=record_2025_01_26 size=toy`, exactly as the pages show it:
    offline on the sample corpus, its 6 steps, saving nothing."""
    cmd = [sys.executable, "train.py", "experiment=record_2025_01_26", "size=toy"]
    for page in ("README.md", "docs/speedruns.md"):
        assert " ".join(cmd[1:]) in (REPO / page).read_text(), page
    run_dir = tmp_path / "run"
    out = subprocess.run([*cmd, f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True,
                         text=True, timeout=350)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    steps = [r[0] for r in curve(run_dir)]
    assert steps == list(range(7))
    assert not (run_dir / "checkpoints").exists()
    log = (run_dir / "train.log").read_text()
    assert (
        "layers: 0: attn long ve0 | 1: attn long | 2: mlp only +out1 | 3: attn long ve2 +out0"
        in log
    )


@pytest.mark.slow
def test_gpu_benchmark_runs_at_toy_size_on_cpu() -> None:
    """Smoke only (timings are the benchmark's business, never a test's): the 2025-11 record
    runs through the compiled step at its three batch phases, and once warm nothing breaks the
    graph or recompiles (the toy traces with the eager backend). The other presets' compiled
    steps: tests/e2e/test_static_compile.py; every preset through the benchmark's code, at
    toy size: tests/e2e/test_gpu_proof.py."""
    cmd = [sys.executable, "scripts/bench/gpu.py", "--experiment", "record_2025_11_29", "--toy",
           "--device", "cpu", "--steps", "1"]  # fmt: skip
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    header = next(line for line in out.stdout.splitlines() if line.startswith("| preset"))
    names = [c.strip() for c in header.strip("|").split("|")]
    rows = [
        dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True))
        for line in out.stdout.splitlines()
        if line.startswith("| record_")
    ]
    assert [r["preset"] for r in rows] == ["record_2025_11_29"] * 3
    # one row per batch phase, its length, window and the record's time
    phases = [(r["window (blocks, long/short)"], r["tokens/step/GPU"], r["record ms/step"])
              for r in rows]  # fmt: skip
    assert phases == [("3/1", "128", "33.90"), ("7/3", "256", "60.10"), ("11/5", "512", "88.10")]
    for r in rows:
        assert int(r["graphs"]) >= 1, r  # the counters see the compile
        assert (r["graph breaks"], r["recompiles"]) == ("0", "0"), r


# Record #89 at its toy size (conf/preset_size/toy/record_2026_07_17.yaml: its 11 layers at
# width 48, three stages over 6 scheduled steps and 2 extension steps, the head tied until step
# 5), the FP8 down projection's delayed weight scale from step 3 (bootstrap 2).
TOY_D = ["model.mlp.fp8_bootstrap=2"]


def run_d(run_dir: Path, cache: Path, *overrides: str) -> float:
    return run(run_dir, cache, "experiment=record_2026_07_17", *TOY_D, *overrides)


def _rank_job_d(rank: int, world: int, run_dir: str, overrides: list[str], cache: str) -> None:
    run_d(Path(run_dir), Path(cache), *overrides)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_record_2026_07_17_toy_same_curve_on_two_ranks_and_resumes_around_the_split(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """record_2026_07_17 at toy size through its three stages (one uninterrupted run, the
    reference): the loss falls; 2 ranks give its curve (5e-3: measured 2e-3 at most, each rank
    summing its own bf16 gradients over Adam's pair before they are averaged, as the record's ranks
    do, where one process sums each step's two micro-steps first), with the preset's
    dist.parallelism=ddp_row_shards (each rank updates its share of the banks and tables); one
    process resumes bit for bit from the save after update 4 (an even step, Adam holding its
    gradient, the head still tied), and two sharded ranks from the save after update 5 (the split
    just made, E's state rows taken from W's; the save gathered from both ranks), the FP8 scales
    mid-sequence at both. The saves are the uninterrupted runs' own, resumed into new run
    directories (a stop's save is the same save: tests/e2e/test_resume.py stops and resumes)."""
    run_d(tmp_path / "one", corpus_cache, "train.checkpoint_every=4", "train.checkpoint_keep=2")
    want = curve(tmp_path / "one")
    assert [r[0] for r in want] == list(range(9)) and want[-1][2] < want[0][2] - 0.3
    saving = ["train.checkpoint_every=5", "train.checkpoint_keep=2"]
    run_torchrun_ranks(_rank_job_d, 2, str(tmp_path / "two"), saving, str(corpus_cache))
    two = curve(tmp_path / "two")
    for (step, *a), (_, *b) in zip(want, two, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, abs=5e-3)), (
                step, x, y,
            )  # fmt: skip
    resumed = tmp_path / "resumed"
    run_d(resumed, corpus_cache, f"train.resume={tmp_path / 'one' / 'checkpoints' / 'step_000004'}")
    assert curve(resumed) == want
    sharded = tmp_path / "two-resumed"
    split = tmp_path / "two" / "checkpoints" / "step_000005"
    run_torchrun_ranks(_rank_job_d, 2, str(sharded), [f"train.resume={split}"], str(corpus_cache))
    assert curve(sharded) == two


# record_medium_2025_12_31 at its toy size (conf/preset_size/toy/record_medium_2025_12_31.yaml: its
# table at 8 layers, its twelve stages one step each, no extension steps, the head tied until step
# 3).
def run_m(run_dir: Path, cache: Path, *overrides: str) -> float:
    return run(run_dir, cache, "experiment=record_medium_2025_12_31", *overrides)


def _rank_job_m(rank: int, world: int, run_dir: str, overrides: list[str], cache: str) -> None:
    run_m(Path(run_dir), Path(cache), *overrides)


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_record_medium_2025_12_31_toy_same_curve_on_two_ranks_and_resumes_around_the_split(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """record_medium_2025_12_31 at toy size through its twelve stages, its four batch sizes and the
    split (one uninterrupted run, the reference): the loss falls; 2 ranks give its curve (5e-3:
    measured 2e-3 at most, the sharded exchanges rounding its bf16 gradients in another order, where
    2 replicated ranks agree to 3e-4), with the preset's dist.parallelism=ddp_row_shards; one
    process resumes bit for bit from the save after update 2 (an even step: Adam holds its gradient,
    the head still tied) and from the save after update 4 (the split made at update 3, E's state
    taken from W's). record_2026_07_17's test resumes sharded ranks."""
    run_m(tmp_path / "one", corpus_cache, "train.checkpoint_every=2", "train.checkpoint_keep=8")
    want = curve(tmp_path / "one")
    assert [r[0] for r in want] == list(range(13)) and want[-1][2] < want[0][2] - 0.3
    run_torchrun_ranks(_rank_job_m, 2, str(tmp_path / "two"), [], str(corpus_cache))
    two = curve(tmp_path / "two")
    for (step, *a), (_, *b) in zip(want, two, strict=True):
        for x, y in zip(a, b, strict=True):
            assert (x is None) == (y is None) and (x is None or x == pytest.approx(y, abs=5e-3)), (
                step, x, y,
            )  # fmt: skip
    for save in ("step_000002", "step_000004"):
        resumed = tmp_path / f"resumed-{save}"
        run_m(resumed, corpus_cache, f"train.resume={tmp_path / 'one' / 'checkpoints' / save}")
        assert curve(resumed) == want, save
