"""A bf16 run on a CPU that only emulates bf16 says so at startup with the measured slowdown:
checked in a process whose oneDNN is held to AVX2 (what an AVX2-only CPU has), on any CPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.runtime import emulated_bf16_slowdown

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import torch; from trainer.runtime import emulated_bf16_slowdown as f; "
    "print(f(torch.device('cpu')))"
)


def test_an_avx2_cpu_reports_bf16_as_emulated_and_slower() -> None:
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=120, check=True,
    ).stdout  # fmt: skip
    assert float(out) > 1.5, out


def test_native_bf16_and_cuda_report_nothing() -> None:
    from optim.muon.newton_schulz import bf16_matmul_is_fast

    if bf16_matmul_is_fast(torch.device("cpu")):
        assert emulated_bf16_slowdown(torch.device("cpu")) is None
    assert emulated_bf16_slowdown(torch.device("cuda")) is None  # asks no device
