"""A new user's first mistakes, from the command line: each bad input fails with one short
message naming the key or file (exit status 1, no traceback, nothing else on stderr); a
SIGTERM'd run prints the exact command that continues it, and that command does; a rerun that
starts fresh never leaves two step series in one metrics.jsonl.
"""

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from subprocess import PIPE

import pytest

from tests.helpers import TINY, sigterm_after

REPO = Path(__file__).resolve().parents[2]

BAD = [
    (["train.steps=-5"], "train.steps must be positive"),
    (["train.batch_size=6", "train.micro_batch_size=4"], "train.micro_batch_size (4)"),
    (["model.n_embd=99"], "model.n_embd"),
    (["train.autocast=fp16"], "train.autocast must be one of"),
    (["+train.step=3"], "did you mean train.steps or train.stages?"),
    # Hydra's own error, without the check
    (["train.step=3"], "did you mean train.steps or train.stages?"),
    (["optim.muon.lrr=0.1"], "did you mean optim.muon.lr?"),
    (["model=tiny2"], "did you mean model=tiny?"),
    (["train.steps=abc"], "train.steps=abc"),
    (["dist.nproc=2", "train.batch_size=7"], "train.batch_size (7)"),
    (["data=local", "data.dir=/nonexistent/shards"], "/nonexistent/shards"),
    (["train.resume=/nonexistent/run"], "/nonexistent/run"),
    (["logging.wandb.enabled=true", "logging.wandb.mode=online"], "logging.wandb.mode=offline"),
]


@pytest.mark.slow
def test_bad_input_is_one_line(tmp_path: Path) -> None:
    # All at once: each is a process start (imports) and a check, not training.
    procs = []
    for k, (overrides, _) in enumerate(BAD):
        cmd = [sys.executable, "train.py", *overrides, f"hydra.run.dir={tmp_path / str(k)}"]
        # No wandb login, and Hydra's short errors whatever the caller's environment says.
        env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
        env.pop("HYDRA_FULL_ERROR", None)
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=PIPE, stderr=PIPE, text=True, env=env))
    for k, ((overrides, named), proc) in enumerate(zip(BAD, procs, strict=True)):
        stdout, stderr = proc.communicate(timeout=300)
        what = f"{' '.join(overrides)}: {stderr[-2000:]}"
        assert proc.returncode == 1, what
        lines = stderr.strip().splitlines()
        assert len(lines) == 1 and named in lines[0], what
        assert lines[0].startswith("error: ") and "Traceback" not in stdout + stderr, what
        assert len(stdout.splitlines()) <= 2, f"{what}\n{stdout}"  # no config dump
        assert not (tmp_path / str(k)).exists(), what  # a run that never started: no dir


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_stopped_run_prints_the_command_that_continues_it(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """The default run directory is new for every launch: the printed command pins it."""
    args = [*TINY, "train.steps=12", "train.checkpoint_at_end=true",
            f"data.cache_dir={corpus_cache}"]  # fmt: skip
    cmd = [sys.executable, str(REPO / "train.py"), *args]  # the default run directory
    status, out = sigterm_after(cmd, tmp_path, None, 5)
    assert status == 143, out[-3000:]
    found = re.search(r"To continue: (\S+) train\.py (.+)$", out, re.MULTILINE)
    assert found, out[-3000:]
    # The interpreter that ran, by the name the shell knows it: `python` only where that is
    # it (an active virtualenv); a run of .venv's python unactivated (make train) gets its path
    python = shutil.which("python") if found.group(1) == "python" else found.group(1)
    assert python is not None and Path(python).absolute() == Path(sys.executable).absolute()
    printed = shlex.split(found.group(2))
    run_dir = Path(next(a for a in printed if a.startswith("hydra.run.dir=")).split("=", 1)[1])
    again = [python, str(REPO / "train.py"), *printed]
    done = subprocess.run(again, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [r["step"] for r in _records(run_dir if run_dir.is_absolute() else tmp_path / run_dir)]
    assert steps == sorted(set(steps)) and steps[-1] == 12, steps


@pytest.mark.slow
def test_fresh_rerun_keeps_one_step_series(tmp_path: Path, corpus_cache: Path) -> None:
    """train.resume=never twice in one directory: one series, the first moved aside whole."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "train.py", *TINY, "train.steps=2", "train.checkpoint_at_end=true"]
    cmd += [f"data.cache_dir={corpus_cache}", f"hydra.run.dir={run_dir}", "train.resume=never"]
    for _ in range(2):
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in _records(run_dir)] == [0, 1, 2]
    (previous,) = (run_dir / "previous").iterdir()
    assert [r["step"] for r in _records(previous)] == [0, 1, 2]
    assert (previous / "checkpoints" / "step_000002").is_dir()
    assert [p.name for p in (run_dir / "checkpoints").glob("step_*")] == ["step_000002"]
