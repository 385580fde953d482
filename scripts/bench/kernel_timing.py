"""What the kernel benchmarks (scripts/bench/loss_kernel.py, mlp_kernel.py) share: the device a
run may use, and interleaved timing (each path's median, repetitions in alternating order, so
a machine's drift falls on both)."""

import statistics
import sys
import time
from collections.abc import Callable

import torch


def kernel_device(script: str, name: str, test: str) -> torch.device:
    """The device `name` (--device) if the Triton kernels can run there; else exit naming why:
    a CUDA GPU, or a CPU under TRITON_INTERPRET=1 (a toy check; `test` checks them there)."""
    from model.triton_code import available

    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU (on a CPU: {test})")
    if (reason := available(device)) is not None:
        sys.exit(f"{script}: {reason}")
    return device


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreted)"


def sync(device: torch.device) -> None:
    """Wait for the GPU's queued work (a CPU's ops are done when they return)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_ms(fn: Callable[[], object], inner: int, device: torch.device) -> float:
    """Milliseconds a call of `fn` takes, the mean of `inner` calls queued back to back."""
    sync(device)
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    sync(device)
    return (time.perf_counter() - t0) * 1000 / inner


def interleaved_ms(
    fns: dict[str, Callable[[], object]], reps: int, inner: int, device: torch.device
) -> dict[str, float]:
    """Each function's median milliseconds over `reps` repetitions, in alternating order."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for rep in range(reps):
        order = list(fns.items()) if rep % 2 == 0 else list(fns.items())[::-1]
        for name, fn in order:
            times[name].append(timed_ms(fn, inner, device))
    return {name: statistics.median(t) for name, t in times.items()}
