"""The kernels' GPU benchmarks (scripts/bench/loss_kernel.py, mlp_kernel.py) run whole at a toy
size on a CPU under Triton's interpreter (`--device cpu`): their timing loops, ratios and
agreement checks, which a GPU session would otherwise be the first to run. Each prints its
lines and passes its own check (exit 0); the times mean nothing here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the kernels need triton (pip install triton)")

REPO = Path(__file__).resolve().parents[2]
BENCHES = {
    "loss_kernel.py": ["--rows", "8", "--vocab", "512"],
    "mlp_kernel.py": ["--tokens", "64", "--d", "32", "--inner", "1"],
}


@pytest.mark.parametrize("script", list(BENCHES))
def test_the_benchmark_runs_whole_on_a_cpu(script: str) -> None:
    cmd = [sys.executable, str(REPO / "scripts" / "bench" / script), "--device", "cpu",
           "--reps", "1", "--no-compile", *BENCHES[script]]  # fmt: skip
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "triton / torch eager:" in done.stdout
    assert done.stdout.count("| agree") == (2 if script == "mlp_kernel.py" else 1), done.stdout


def test_without_the_interpreter_a_cpu_is_refused_with_the_reason() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, str(REPO / "scripts" / "bench" / "mlp_kernel.py"), "--device", "cpu"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "TRITON_INTERPRET=1" in done.stderr, done.stderr
