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


def test_the_startup_warning_names_every_bf16_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where bf16 is emulated (a measured 20x here), a run says so and names each setting that
    brings bf16 in, with its way out; with native bf16, or no bf16, it says nothing."""
    import trainer.cpu_cost as cpu_cost
    from tests.helpers import compose_config
    from trainer.config import to_config
    from trainer.runtime import Runtime

    def conf(*overrides: str):
        return to_config(compose_config(["run_dir=.", *overrides]))

    cpu = torch.device("cpu")
    fp32 = Runtime(0, 1, 0, cpu, None)
    bf16 = Runtime(0, 1, 0, cpu, torch.bfloat16)
    monkeypatch.setattr(cpu_cost, "emulated_bf16_slowdown", lambda device: 20.0)
    said = cpu_cost.cpu_cost_warning(conf("train.autocast=bf16", "optim.muon.ns_dtype=bf16"), bf16)
    assert said is not None and "runs 20x slower than an fp32 one" in said
    assert "train.autocast=bf16 (train.autocast=none: fp32)" in said
    assert "optim.muon.ns_dtype=bf16 (auto: fp32 on this CPU)" in said
    assert "model.dtype" not in said
    said = cpu_cost.cpu_cost_warning(conf("experiment=record_2025_01_26"), fp32)
    assert said is not None and "model.dtype=bf16" in said
    assert cpu_cost.cpu_cost_warning(conf("train.autocast=none"), fp32) is None
    monkeypatch.setattr(cpu_cost, "emulated_bf16_slowdown", lambda device: None)  # native
    assert cpu_cost.cpu_cost_warning(conf("train.autocast=bf16"), bf16) is None
