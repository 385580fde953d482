"""Launching: torchrun (one node, two loopback nodes, a restart), `dist.nproc`, Hydra multirun.

Every run here is a real `torchrun`/`python train.py` subprocess with its working directory in
a temporary folder, so the test sees exactly which files each launch creates.
"""

import json
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from tests.dist_utils import run_torchrun_ranks
from tests.helpers import TINY, compose_config, sigterm_after
from train import train
from trainer.launch.dist import free_port
from trainer.run_dir import launch_dir, rank_zero

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# Fail within a minute rather than hang if a rank goes missing.
QUICK = [*TINY, "train.steps=2", "dist.timeout_s=60"]


def run(cmd: list[str], cwd: Path, timeout: int = 240) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd} failed:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return out


def run_dirs(root: Path) -> list[Path]:
    """Every directory under `root` that holds a metrics file or a .hydra folder."""
    found = {p.parent for p in root.rglob("metrics.jsonl")} | {
        p.parent for p in root.rglob(".hydra")
    }
    return sorted(found)


def steps(run_dir: Path) -> list[int]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_loopback_nodes_finish_a_run(tmp_path: Path, corpus_cache: Path) -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    node = [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        "--rdzv-id=loopback",
        str(REPO / "train.py"),
        *QUICK,
        f"data.cache_dir={corpus_cache}",
    ]
    nodes = [
        subprocess.Popen(node, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=240)[0].decode() for p in nodes]
    finally:
        for p in nodes:
            p.kill()
    for p, out in zip(nodes, outputs, strict=True):
        assert p.returncode == 0, out[-5000:]
    # Nodes may not share a start time, so a multi-node run is named by its rendezvous id.
    assert run_dirs(tmp_path) == [tmp_path / "outputs" / "torchrun-loopback"]
    assert steps(tmp_path / "outputs" / "torchrun-loopback") == [0, 1, 2]


@pytest.mark.slow
@pytest.mark.timeout(500)
def test_torchrun_restart_resumes_from_the_latest_checkpoint(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """Rank 1 SIGKILLs itself after step 9 (no handler runs, as with the OOM killer);
    torchrun --max-restarts=1 relaunches both ranks into the same run directory, they resume
    from step 6's checkpoint and end where the uninterrupted run (the same `train` on two
    ranks) ends. Both launches of the two ranks write one run directory, named like a
    single-process run's (outputs/<date>/<time>), nothing beside it, and rank 0 alone logs."""
    args = [
        *TINY,
        "train.steps=12",
        "train.val_every=6",
        "train.checkpoint_every=6",
        "dist.timeout_s=60",
        f"data.cache_dir={corpus_cache}",
    ]
    straight = tmp_path / "straight"
    run_torchrun_ranks(_straight_rank, 2, args, str(straight))
    launch = [*TORCHRUN, "--standalone", "--nproc_per_node=2", "--max-restarts=1"]
    (tmp_path / "killed").mkdir()
    out = run([*launch, str(REPO / "train.py"), *args, "train.fault.rank=1",
               "train.fault.kill_at_step=9"], cwd=tmp_path / "killed", timeout=400)  # fmt: skip
    (run_dir,) = run_dirs(tmp_path / "killed")
    assert [p.name for p in (tmp_path / "killed").iterdir()] == ["outputs"], "beside outputs/"
    datetime.strptime(
        str(run_dir.relative_to(tmp_path / "killed" / "outputs")), "%Y-%m-%d/%H-%M-%S"
    )
    assert steps(run_dir) == list(range(13)), "each step logged once, the lost ones dropped"
    assert (run_dir / ".fault-kill-fired").is_file()
    assert "restart" in out.stderr.lower() or "restart" in out.stdout.lower()
    log = (run_dir / "train.log").read_text()
    assert f"resumed from {run_dir.resolve() / 'checkpoints' / 'step_000006'}" in log
    assert log.count("2 ranks on cpu (1 thread/rank)") == 2, "one line per launch: rank 0's"
    assert log.count("step 12/12") == 1 and "final val loss" in log
    killed = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    want = json.loads((straight / "metrics.jsonl").read_text().splitlines()[-1])
    assert killed["val_loss"] == pytest.approx(want["val_loss"], abs=1e-6)
    assert killed["train_loss"] == pytest.approx(want["train_loss"], abs=1e-6)


def _straight_rank(rank: int, world: int, args: list[str], run_dir: str) -> None:
    train(compose_config([*args, f"run_dir={run_dir}"]))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_multirun_points_can_be_multi_process(tmp_path: Path, corpus_cache: Path) -> None:
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        "-m",
        *QUICK,
        "dist.nproc=2",
        "seed=0,1",
        f"data.cache_dir={corpus_cache}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    run(cmd, cwd=tmp_path, timeout=380)
    assert run_dirs(tmp_path) == [tmp_path / "sweep" / "0", tmp_path / "sweep" / "1"]
    for job in run_dirs(tmp_path):
        assert steps(job) == [0, 1, 2]
        log = (job / "train.log").read_text()
        assert (
            "starting 2 ranks" in log
            and "2 ranks on cpu (1 thread/rank)" in log
            and "final val loss" in log
        )


@pytest.mark.timeout(120)
def test_failing_rank_error_reaches_torchrun(tmp_path: Path) -> None:
    cmd = [
        *TORCHRUN,
        "--standalone",
        "--nproc_per_node=2",
        str(REPO / "train.py"),
        "model.n_head=3",
    ]
    out = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=100)
    assert out.returncode != 0
    summary = out.stderr[out.stderr.index("Root Cause") :]
    # Each rank writes its error to torchrun's error file, so its summary shows it.
    assert "must be divisible by model.n_head (3)" in summary
    assert "To enable traceback" not in summary
    assert not list(tmp_path.rglob("metrics.jsonl"))


def test_rank_zero_alone_gets_a_run_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    assert launch_dir("outputs") == "."
    assert rank_zero(".hydra", None) is None
    monkeypatch.setenv("RANK", "0")
    assert rank_zero(".hydra", None) == ".hydra"


# A stand-in for torchrun: notes when it started, then asks two "workers" started 1 s apart
# (as a restart would be) for their run directory.
LAUNCHER = """
import json, os, subprocess, sys, time
started = time.time()
ask = "from trainer.run_dir import launch_dir; print(launch_dir('outputs'))"
worker = [sys.executable, "-c", ask]
env = {**os.environ, "TORCHELASTIC_RUN_ID": "abc", "RANK": "0"}
env.pop("GROUP_WORLD_SIZE", None)
first = subprocess.run(worker, env=env, capture_output=True, text=True, check=True).stdout
time.sleep(1.1)
again = subprocess.run(worker, env=env, capture_output=True, text=True, check=True).stdout
print(json.dumps([started, first.strip(), again.strip()]))
"""


def test_torchrun_run_directory_is_the_launchers_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun it is the parent's start time: the same for every worker and restart."""
    out = subprocess.run(
        [sys.executable, "-c", LAUNCHER], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    started, first, again = json.loads(out.stdout)
    assert first == again, "a later worker of the same launcher got another directory"
    stamp = datetime.strptime(first, "outputs/%Y-%m-%d/%H-%M-%S")
    # The launcher noted its start just after the interpreter came up; the stamp is truncated
    # to the second.
    assert 0 <= started - stamp.timestamp() < 3
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    assert launch_dir("outputs") == "outputs/torchrun-abc"  # several nodes


def test_nproc_under_torchrun_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    with pytest.raises(ValueError, match=r"leave dist\.nproc at 1 under torchrun"):
        train(compose_config([*TINY, "dist.nproc=2", "run_dir=/nonexistent"]))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_to_dist_nproc_parent_saves_and_exits_promptly(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """The launcher forwards the signal; the ranks save, exit at once, and a rerun resumes."""
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(REPO / "train.py"),
        *TINY,
        "train.steps=10",
        "train.val_every=0",
        "train.checkpoint_at_end=true",
        "dist.nproc=2",
        "dist.timeout_s=60",
        f"data.cache_dir={corpus_cache}",
        f"hydra.run.dir={run_dir}",
    ]
    status, out = sigterm_after(cmd, tmp_path, run_dir, records=4)
    assert status == 128 + signal.SIGTERM, out[-3000:]
    # The launcher SIGKILLs ranks still alive 30 s after forwarding a signal and says so.
    assert "forcefully exiting" not in out, out[-3000:]
    stopped_at = steps(run_dir)[-1]
    assert (run_dir / "checkpoints" / f"step_{stopped_at:06d}" / "meta.json").is_file()
    run(cmd, cwd=tmp_path)
    assert steps(run_dir) == list(range(11))
