"""Ctrl-C stops a run at the next safe point without starting new work: during the first
evaluation it exits within a batch and writes nothing; the message says a second Ctrl-C
quits at once. Inside another program (a test runner) the trainer leaves that program's
Ctrl-C alone, also after a `dist.nproc` launch."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[2]


def _start(args: list[str], tmp_path: Path) -> subprocess.Popen:
    cmd = [sys.executable, str(REPO / "train.py"), *args, f"hydra.run.dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    return subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def _wait_for(proc: subprocess.Popen, text: str, timeout: float = 120) -> list[str]:
    """The output lines up to and including the first that contains `text`."""
    lines, limit = [], time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < limit:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    proc.kill()
    pytest.fail(f"no line with {text!r}:\n{''.join(lines)[-3000:]}")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_in_the_first_evaluation_stops_at_once_and_saves_nothing(
    tmp_path: Path, corpus_cache: Path
) -> None:
    # The default run as `python train.py` starts it: its first evaluation is 24 batches of
    # 2,048 tokens (~13 s here), and the signal lands early in it.
    args = [f"data.cache_dir={corpus_cache}"]
    proc = _start(args, tmp_path)
    _wait_for(proc, "param groups")  # startup is over: the first evaluation is running
    time.sleep(1.0)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert took < 10, f"{took:.1f}s after the signal:\n{out[-3000:]}"
    assert "Ctrl-C again quits at once" in out, out[-3000:]
    assert "no checkpoint written (no update happened)" in out, out[-3000:]
    assert "To continue" not in out, out[-3000:]  # there is nothing to continue
    checkpoints = tmp_path / "run" / "checkpoints"
    assert not checkpoints.exists() or not list(checkpoints.glob("step_*"))
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip()  # step 0 never finished


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_during_training_finishes_the_step_and_saves_once(
    tmp_path: Path, corpus_cache: Path
) -> None:
    args = [
        *TINY, "train.steps=400", "train.val_every=0", "train.checkpoint_at_end=true",
        f"data.cache_dir={corpus_cache}",
    ]  # fmt: skip
    proc = _start(args, tmp_path)
    _wait_for(proc, "step   3/400")
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert out.count("SIGINT received") == 1 and "checkpoint saved to" in out, out[-3000:]
    saved = sorted((tmp_path / "run" / "checkpoints").glob("step_*"))
    assert len(saved) == 1, saved
    step = int(saved[0].name.removeprefix("step_"))
    assert 3 <= step < 400
    assert f"stopped by SIGINT after step {step}" in out


def test_train_in_another_program_leaves_its_signals_alone(
    tmp_path: Path, corpus_cache: Path
) -> None:
    """A test runner's Ctrl-C must stop the runner: a library call installs no handler."""
    from tests.helpers import compose_config
    from trainer.launch.signals import StopRequests

    before = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM))
    seen = []

    class Spy(StopRequests):
        def __enter__(self) -> "StopRequests":
            super().__enter__()
            seen.append((signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)))
            return self

    import trainer.session

    original = trainer.session.StopRequests
    trainer.session.StopRequests = Spy
    try:
        from train import train

        overrides = [*TINY, "train.steps=1", f"data.cache_dir={corpus_cache}"]
        train(compose_config([*overrides, f"run_dir={tmp_path}"]))
    finally:
        trainer.session.StopRequests = original
    assert seen == [before]
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_dist_launch_puts_the_callers_handlers_back(tmp_path: Path, corpus_cache: Path) -> None:
    """torch's elastic agent installs its own handlers in the launching process and keeps
    them; after `dist.nproc=2` the caller's Ctrl-C is its own again."""
    from tests.helpers import compose_config
    from train import train

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    overrides = [*TINY, "dist.nproc=2", "train.steps=1", f"data.cache_dir={corpus_cache}"]
    train(compose_config([*overrides, f"run_dir={tmp_path}"]))
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ctrl_c_on_two_ranks_is_one_message(tmp_path: Path, corpus_cache: Path) -> None:
    """A terminal's Ctrl-C reaches the launcher and both ranks (one process group), and the
    launcher forwards its own copy: still one request, said once, one checkpoint."""
    args = [
        *TINY, "dist.nproc=2", "train.steps=400", "train.val_every=0",
        "train.checkpoint_at_end=true", f"data.cache_dir={corpus_cache}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    cmd = [sys.executable, str(REPO / "train.py"), *args]
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(
        cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True,
    )  # fmt: skip
    before = "".join(_wait_for(proc, "step   3/400"))
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does
    out = before + proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert out.count("SIGINT received") == 1, out[-3000:]
    assert "death signal" not in out and "via signal" not in out, out[-3000:]
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert len(list((tmp_path / "run" / "checkpoints").glob("step_*"))) == 1
    assert re.search(r"To continue: \S+ train\.py ", out), out[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_stop_during_a_slow_step_is_announced_at_once(tmp_path: Path, corpus_cache: Path) -> None:
    """Step 3 holds the main thread for 8 s inside one operation (train.fault.slow_step_at),
    where no Python signal handler can run: the SIGTERM is still announced within a second or
    two, naming the step and how long it has run; the run stops after that step, saved."""
    hold = 8.0
    args = [
        *TINY, "train.steps=6", "train.val_every=0", "train.checkpoint_at_end=true",
        "train.fault.slow_step_at=3", f"train.fault.slow_step_s={hold}",
        f"data.cache_dir={corpus_cache}",
    ]  # fmt: skip
    proc = _start(args, tmp_path)
    _wait_for(proc, "step 2/6")  # step 3 starts now, and is held
    time.sleep(1.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    said = _wait_for(proc, "SIGTERM received", timeout=hold)[-1]
    announced = time.monotonic() - sent
    out, _ = proc.communicate(timeout=120)
    ended = time.monotonic() - sent
    assert announced < 3, f"announced {announced:.1f}s after the signal: {said}"
    assert ended > hold - 3, f"the run ended {ended:.1f}s after the signal: no step was held"
    running = float(said.split("step 3 of 6 has been running for ")[1].split("s;")[0])
    assert 1.0 <= running < hold, said
    assert "the run stops when it ends" in said
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert out.count("SIGTERM received") == 0  # said once, before
    assert "stopped by SIGTERM after step 3" in out, out[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step_000003").is_dir()
