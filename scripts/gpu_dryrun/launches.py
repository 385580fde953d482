"""Kernel launches per optimizer step, counted on the pretend H100 (`python -m scripts.gpu_dryrun
--optimizer`): the eager optimizer against the compiled one, a normal step and an Adam step.

A launch is a Triton kernel the compiled code starts (fake_gpu.py counts them) or an op the
pretend device's backend computes (host_cuda.cpp counts them at the outermost call: its CPU
fallback's own copies are not launches): every ATen op on a "cuda" tensor but views, aliases
and allocations, which reach no kernel. So an eager step's count is its ATen kernels, and a
compiled step's its Triton kernels plus the ATen ops its wrapper calls (the matrix products,
which inductor leaves to cuBLAS, and copies). What a cuBLAS call or a multi-tensor op launches
inside counts one here.
"""

import ctypes
from collections.abc import Callable
from typing import Any

from scripts.gpu_dryrun import fake_gpu


def backend_launches() -> int:
    """Ops the pretend device's backend has computed so far (the shim's counter)."""
    lib = ctypes.CDLL(str(fake_gpu.shim_path()))
    lib.host_cuda_launches.restype = ctypes.c_int64
    return int(lib.host_cuda_launches())


def launches(step: Callable[[], object]) -> int:
    """Kernel launches of one call of `step` (Triton's and the backend's)."""
    triton, backend = fake_gpu.LAUNCHES[0], backend_launches()
    step()
    return fake_gpu.LAUNCHES[0] - triton + backend_launches() - backend


def optimizer_rows(conf: Any, world: int) -> list[dict]:
    """Per mode (eager, compiled): the launches of a normal and of an Adam step of the
    preset's optimizer, after a warm-up that compiles both."""
    from scripts.bench.optim_step import MODES, build, kind
    from trainer.runtime import init_runtime

    rt = init_runtime("cuda", "none")
    rows = []
    for mode, on in MODES.items():
        opt = build(conf, rt, on, world)  # inductor: Triton kernels for sm_90
        for _ in range(2 * opt.period()):  # both kinds compile
            opt.step()
        counts: dict[str, int] = {}
        for _ in range(opt.period()):
            k = kind(opt)
            counts[k] = launches(opt.step)
        rows.append({"mode": mode, "world": world, **counts})
        del opt
    return rows
