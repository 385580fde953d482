"""A bf16 run on a CPU where bf16 is slow says so at startup with the measured slowdown:
checked in a process whose oneDNN is held to AVX2 (what an AVX2-only CPU has), on any CPU; and
which CPUs count as having native bf16."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from optim.muon.ns_dtype import bf16_matmul_is_fast
from trainer.runtime import bf16_slowdown

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

REPO = Path(__file__).resolve().parents[2]
PROBE = (
    "import torch; from trainer.runtime import bf16_slowdown as f; "
    "from optim.muon.ns_dtype import bf16_matmul_is_fast as n; "
    "print(f(torch.device('cpu')), n(torch.device('cpu')))"
)


def probe(**env: str) -> tuple[float, bool]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=REPO, env={**os.environ, **env},
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    return float(out[0]), out[1] == "True"


def test_an_avx2_cpu_reports_bf16_as_emulated_and_slower() -> None:
    slower, native = probe(ONEDNN_MAX_CPU_ISA="AVX2", ATEN_CPU_CAPABILITY="avx2")
    assert slower > 1.5 and not native


def test_avx512_without_bf16_is_not_native() -> None:
    """torch's own check says yes on any AVX-512 CPU; oneDNN held to AVX-512 without BF16 (as
    on a Skylake) emulates bf16, and so does this check's answer."""
    _, native = probe(ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    assert not native


def test_native_bf16_follows_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import optim.muon.ns_dtype as ns

    cpu = torch.device("cpu")
    monkeypatch.setattr(ns.torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    for flags, native in [({"avx512f"}, False), ({"avx512_bf16"}, True), ({"amx_bf16"}, True)]:
        monkeypatch.setattr(ns, "cpu_flags", lambda flags=flags: frozenset(flags))
        assert bf16_matmul_is_fast(cpu) is native, flags
    for cap, native in [
        ("AVX512_CORE_VNNI", False),
        ("avx2", False),
        ("AVX512_CORE_BF16", True),
        ("AVX512_CORE_FP16", True),
        ("AVX512_CORE_AMX", True),
        ("ALL", True),
    ]:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert bf16_matmul_is_fast(cpu) is native, cap  # fmt: skip
    assert bf16_matmul_is_fast(torch.device("cuda"))  # asks no device
    assert bf16_slowdown(torch.device("cuda")) is None


def test_the_startup_warning_names_every_bf16_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where bf16 is slow (a measured 20x here), a run says so and names each setting that
    brings bf16 in, with its way out; where bf16 is fast, or unused, it says nothing."""
    import trainer.observe.cpu_cost as cpu_cost
    from tests.helpers import compose_config
    from trainer.config import to_config
    from trainer.runtime import Runtime

    def conf(*overrides: str):
        return to_config(compose_config(["run_dir=.", *overrides]))

    cpu = torch.device("cpu")
    fp32 = Runtime(0, 1, 0, cpu, None)
    bf16 = Runtime(0, 1, 0, cpu, torch.bfloat16)
    monkeypatch.setattr(cpu_cost, "bf16_slowdown", lambda device: 20.0)
    monkeypatch.setattr(cpu_cost, "bf16_matmul_is_fast", lambda device: False)
    said = cpu_cost.cpu_cost_warning(conf("train.autocast=bf16", "optim.muon.ns_dtype=bf16"), bf16)
    assert said is not None and said.startswith("bf16 is emulated on this CPU")
    assert "a bf16 matmul runs 20.0x slower than an fp32 one" in said
    assert "train.autocast=bf16 (train.autocast=none: fp32)" in said
    assert "optim.muon.ns_dtype=bf16 (optim.muon.ns_dtype=fp32: fp32)" in said
    assert "model.numerics.dtype" not in said
    monkeypatch.setattr(cpu_cost, "bf16_matmul_is_fast", lambda device: True)
    monkeypatch.setattr(cpu_cost, "bf16_slowdown", lambda device: 2.1)  # native, still slower
    said = cpu_cost.cpu_cost_warning(conf("experiment=record_2025_01_26"), fp32)
    assert said is not None and "native on this CPU" in said and "model.numerics.dtype=bf16" in said
    assert cpu_cost.cpu_cost_warning(conf("train.autocast=none"), fp32) is None
    monkeypatch.setattr(cpu_cost, "bf16_slowdown", lambda device: 0.3)  # AMX: faster
    assert cpu_cost.cpu_cost_warning(conf("train.autocast=bf16"), bf16) is None
