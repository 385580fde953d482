"""README.md's smoke command runs as printed: it starts, trains, logs, and stops cleanly on
Ctrl-C after its first step (the remaining steps run the same code; a whole smoke run is a
minute of CPU). The record toy command runs whole in tests/e2e/test_records.py; every
train.py command's config and every script's flags are checked in tests/unit/test_readme.py."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_interrupt import _wait_for
from tests.unit.test_readme import readme_commands

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_smoke_command_runs_as_printed(tmp_path: Path, corpus_cache: Path) -> None:
    assert ["python", "train.py", "experiment=smoke"] in readme_commands()
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "train.py",
        "experiment=smoke",
        f"hydra.run.dir={run_dir}",
        f"data.cache_dir={corpus_cache}",
    ]  # fmt: skip  (the suite's shared corpus cache)
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)  # fmt: skip
    lines = _wait_for(proc, "step  1/20")  # the first step is always logged
    proc.send_signal(signal.SIGINT)
    out = "".join(lines) + proc.communicate(timeout=120)[0]
    assert proc.returncode == 128 + signal.SIGINT, out[-3000:]
    assert "step  0/20" in out and "val" in out, out[-3000:]  # the first evaluation ran
    assert "this run saves none" in out and "Traceback" not in out, out[-3000:]
    assert not (run_dir / "checkpoints").exists()
