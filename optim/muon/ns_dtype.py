"""The precision Newton–Schulz runs in (`optim.muon.ns_dtype`): bf16 where bf16 matmuls are
native (CUDA; a CPU with AVX-512 BF16 or AMX that oneDNN may use), fp32 where bf16 would be
emulated, 5-90x slower (docs/cpu-kinds.md)."""

import functools
import os
from pathlib import Path

import torch

# `optim.muon.ns_dtype`: the precision Newton–Schulz runs in. auto = bf16 where bf16 matmuls
# are fast (CUDA, CPUs with native bf16), fp32 elsewhere.
NS_DTYPE_OF: dict[str, torch.dtype | None] = {
    "auto": None,
    "bf16": torch.bfloat16,
    "fp32": torch.float32,
}


# The CPU flags of native bf16 matmul instructions (Linux /proc/cpuinfo names)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
# oneDNN's ISA levels below its bf16 kernels (`ONEDNN_MAX_CPU_ISA` values): held to one of
# these, oneDNN emulates bf16 whatever the CPU has
BELOW_BF16_ISAS = (
    "SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
)  # fmt: skip


def bf16_matmul_is_fast(device: torch.device) -> bool:
    """Whether `device` has native bf16 matmuls: always on CUDA; on a CPU, AVX-512 BF16 or
    AMX instructions that oneDNN is allowed to use (`ONEDNN_MAX_CPU_ISA` can hold it below
    them). Without them oneDNN emulates bf16, 5-90x slower than fp32 (docs/cpu-kinds.md).
    torch's own check (`_is_mkldnn_bf16_supported`) also says yes on AVX-512 CPUs without
    BF16, where bf16 is emulated, so this reads the CPU's flags."""
    if device.type == "cuda":
        return True
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    flags = cpu_flags()
    if flags is not None and not any(f in flags for f in BF16_FLAGS):
        return False
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "ALL"))
    return cap.strip().upper() not in BELOW_BF16_ISAS


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags from /proc/cpuinfo; None where there is none (not Linux)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((x for x in text.splitlines() if x.startswith("flags")), None)
    return frozenset(line.split(":", 1)[1].split()) if line else None


def resolve_ns_dtype(setting: str, device: torch.device) -> torch.dtype:
    """`optim.muon.ns_dtype` as a dtype for `device`."""
    if setting not in NS_DTYPE_OF:
        raise ValueError(f"ns_dtype must be one of {sorted(NS_DTYPE_OF)}, got {setting!r}")
    dtype = NS_DTYPE_OF[setting]
    if dtype is None:
        return torch.bfloat16 if bf16_matmul_is_fast(device) else torch.float32
    return dtype
