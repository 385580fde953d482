"""What a run's configuration costs on this CPU beyond its fp32 equivalent, said at startup.

Only bf16 depends on the CPU kind this much: with AVX-512 BF16 or AMX it is native (faster
than fp32), on other CPUs oneDNN emulates it and a bf16 matmul runs 10–60× slower than fp32
(measured: `emulated_bf16_slowdown`). bf16 reaches the matmuls through `train.autocast`,
`model.dtype` and `optim.muon.ns_dtype`; each names its way out. FP8 products never depend on
the kind (model/fp8.py emulates them in fp32 on every CPU), nor do fp32 runs. README, "Every
CPU kind", has the table.
"""

import torch

from trainer.config import Config
from trainer.runtime import Runtime, emulated_bf16_slowdown


def bf16_settings(conf: Config, rt: Runtime) -> list[str]:
    """The settings that put bf16 matmuls into this run, each with what runs it in fp32."""
    used = []
    if rt.autocast_dtype == torch.bfloat16:
        used.append(f"train.autocast={conf.train.autocast} (train.autocast=none: fp32)")
    if conf.model.dtype == "bf16":
        used.append("model.dtype=bf16 (the preset's bf16 model; model.dtype=fp32: fp32)")
    if conf.optim.muon.ns_dtype == "bf16":
        used.append("optim.muon.ns_dtype=bf16 (auto: fp32 on this CPU)")
    return used


def cpu_cost_warning(conf: Config, rt: Runtime) -> str | None:
    """The startup warning for a run whose bf16 is emulated on this CPU, with the slowdown
    measured now; None when nothing in it is slow here (a GPU, native bf16, no bf16)."""
    used = bf16_settings(conf, rt)
    if not used:
        return None
    slower = emulated_bf16_slowdown(rt.device)
    if slower is None:
        return None
    return (
        f"bf16 is emulated on this CPU (no AVX-512 BF16 or AMX): a bf16 matmul runs "
        f"{slower:.0f}x slower than an fp32 one here, so this run is several times slower than "
        f"on a CPU with native bf16. bf16 comes from: {'; '.join(used)}."
    )
