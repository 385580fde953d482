"""A mistake costs one line under every launcher, as under plain `python train.py`.

Under torchrun rank 0 prints the line, the other ranks say nothing, no traceback shows the
project's code, and torchrun's own failure summary (which the project cannot remove) names
the error without one. Under `dist.nproc=N` the whole output is the one line. A launch mode
that only a multirun uses (a Hydra launcher, a sweep preset) is refused without `-m`.
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
# A collective waiting for a rank that has gone fails within a minute rather than hangs.
QUICK = [*TINY, "dist.timeout_s=60"]
# A frame of the project's own code in a traceback (torch's and torchrun's frames aside).
PROJECT_FRAME = re.compile(rf'File "{re.escape(str(REPO))}/(?!\.venv)')


def launch(cmd: list[str], cwd: Path, timeout: float = 100) -> subprocess.CompletedProcess:
    """Run `cmd`; past `timeout`, end it with every rank it started (its process group)."""
    env = dict(os.environ)
    env.pop("HYDRA_FULL_ERROR", None)  # the short errors, whatever the caller's environment
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"still running after {timeout} s:\n{stdout[-2000:]}\n{stderr[-2000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def error_lines(out: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (out.stdout + out.stderr).splitlines() if line.startswith("error:")]


def missing_data(tmp_path: Path) -> list[str]:
    return ["data=fineweb10b", f"data.dir={tmp_path / 'no-shards'}"]


def assert_one_line_under_torchrun(out: subprocess.CompletedProcess, named: str) -> None:
    both = out.stdout + out.stderr
    assert out.returncode != 0, both[-3000:]
    lines = error_lines(out)
    assert len(lines) == 1 and named in lines[0], both[-5000:]
    assert not PROJECT_FRAME.search(both), both[-5000:]
    # torchrun's summary follows, naming the error (each rank's error file holds its message).
    summary = out.stderr[out.stderr.index("Root Cause") :]
    assert named in summary and "To enable traceback" not in summary, summary


@pytest.mark.timeout(120)
def test_a_typo_under_torchrun_is_one_line(tmp_path: Path) -> None:
    out = launch([*TORCHRUN, str(REPO / "train.py"), *QUICK, "train.step=3"], tmp_path)
    want = "unknown config key train.step; did you mean train.steps or train.stages?"
    assert_one_line_under_torchrun(out, want)


@pytest.mark.timeout(120)
def test_missing_data_under_torchrun_is_one_line(tmp_path: Path) -> None:
    """Rank 0 meets the missing directory while rank 1 waits for it to build the data: rank 1
    learns that rank 0 failed and leaves without an error of its own."""
    cmd = [*TORCHRUN, str(REPO / "train.py"), *QUICK, *missing_data(tmp_path)]
    out = launch(cmd, tmp_path)
    assert_one_line_under_torchrun(out, f"{tmp_path / 'no-shards'} is not a directory")
    assert not list(tmp_path.glob("outputs/*/*")), "a run that never started leaves no directory"


@pytest.mark.timeout(120)
def test_missing_data_under_dist_nproc_is_the_whole_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train.py"), *QUICK, "dist.nproc=2", *missing_data(tmp_path),
           f"hydra.run.dir={run_dir}"]  # fmt: skip
    out = launch(cmd, tmp_path)
    assert out.returncode == 1, (out.stdout + out.stderr)[-5000:]
    assert out.stdout == "", out.stdout[-3000:]
    (line,) = out.stderr.splitlines() or [""]
    assert line.startswith("error: data.dir=") and "is not a directory" in line, out.stderr[-5000:]
    assert not run_dir.exists(), "a run that never started leaves no directory"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["launcher=slurm"], "launcher=slurm"),
        (["experiment=sample_muon_vs_adamw"], "experiment=sample_muon_vs_adamw"),
        (["hparams_search=optuna"], "hparams_search=optuna"),
    ],
)
def test_a_multirun_mode_without_m_is_refused(
    tmp_path: Path, overrides: list[str], named: str
) -> None:
    run_dir = tmp_path / "run"
    cmd = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    out = launch(cmd, tmp_path, timeout=30)  # a refusal is instant; the run it refuses is not
    assert out.returncode == 1, (out.stdout + out.stderr)[-3000:]
    (line,) = out.stderr.splitlines() or [""]
    fix = f"python train.py -m {' '.join(overrides)}"
    assert line.startswith(f"error: {named} ") and fix in line, out.stderr[-3000:]
    assert out.stdout == "" and not run_dir.exists(), out.stdout[-3000:]
