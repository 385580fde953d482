"""What a run's configuration costs on this CPU beyond its fp32 equivalent, said at startup.

Only bf16 depends on the CPU kind this much. Without AVX-512 BF16 or AMX, oneDNN emulates it
and a bf16 matmul runs 5–90× slower than fp32; with AVX-512 BF16 but no AMX it is native but
can still lose to the fp32 BLAS (about 2× on a Xeon here); with AMX it is faster. bf16
reaches the matmuls through `train.autocast`, `model.numerics.dtype` and
`optim.muon.ns_dtype`: a run
that uses any of them measures the ratio (`bf16_slowdown`, ~0.2 s) and, where bf16 is more
than `SLOWER` times slower, says so with the factor and each setting's way out. FP8 products
never depend on the kind (model/fp8.py emulates them in fp32 on every CPU), nor do fp32 runs.
docs/cpu-kinds.md has the table.
"""

import torch

from optim.muon.ns_dtype import bf16_matmul_is_fast
from trainer.config import Config
from trainer.runtime import Runtime, bf16_slowdown

# Warn where a bf16 matmul is more than this many times slower than an fp32 one
SLOWER = 1.5


def bf16_settings(conf: Config, rt: Runtime) -> list[str]:
    """The settings that put bf16 matmuls into this run, each with what runs it in fp32."""
    used = []
    if rt.autocast_dtype == torch.bfloat16:
        used.append(f"train.autocast={conf.train.autocast} (train.autocast=none: fp32)")
    if conf.model.numerics.dtype == "bf16":
        used.append(
            "model.numerics.dtype=bf16 (the preset's bf16 model; model.numerics.dtype=fp32: fp32)"
        )
    if conf.optim.muon.ns_dtype == "bf16":
        used.append("optim.muon.ns_dtype=bf16 (optim.muon.ns_dtype=fp32: fp32)")
    return used


def cpu_cost_warning(conf: Config, rt: Runtime) -> str | None:
    """The startup warning for a run whose bf16 is slow on this CPU, with the slowdown measured
    now; None when nothing in it is slow here (a GPU, fast bf16, no bf16)."""
    used = bf16_settings(conf, rt)
    if not used:
        return None
    slower = bf16_slowdown(rt.device)
    if slower is None or slower <= SLOWER:
        return None
    if bf16_matmul_is_fast(rt.device):
        why = "bf16 is native on this CPU but its matmuls lose to fp32 here"
    else:
        why = "bf16 is emulated on this CPU (no AVX-512 BF16 or AMX)"
    return (
        f"{why}: a bf16 matmul runs {slower:.1f}x slower than an fp32 one, so this run's "
        f"matmuls are slower than in fp32. bf16 comes from: {'; '.join(used)}."
    )
