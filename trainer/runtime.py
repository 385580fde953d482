"""Where the run executes: device, process rank, precision, seeding.

The rank and world size come from torchrun's environment variables; with none set this is
a single process. Multi-process setup builds on `Runtime` without changing its callers.
"""

import os
import random
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from optim.muon.ns_dtype import bf16_matmul_is_fast


@dataclass(frozen=True)
class Runtime:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    autocast_dtype: torch.dtype | None  # None: plain fp32
    # dist.tensor_parallel: the T neighbouring ranks of a group read one batch
    tensor_parallel: int = 1

    @property
    def data_rank(self) -> int:
        """Which share of the data this rank reads: its tensor-parallel group's."""
        return self.rank // self.tensor_parallel

    @property
    def data_world(self) -> int:
        """How many shares the data is split into: one per tensor-parallel group."""
        return self.world_size // self.tensor_parallel

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes logs, metrics and files."""
        return self.rank == 0

    def autocast(self) -> AbstractContextManager:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def synchronize(self) -> None:
        """Wait for queued device work so wall-clock timings are honest."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def bf16_slowdown(device: torch.device) -> float | None:
    """How many times slower a bf16 matmul runs than an fp32 one on this CPU, measured now on
    a 256² product (~0.2 s): 5-90 where bf16 is emulated, about 2 with AVX-512 BF16 but no
    AMX on some Intel CPUs, below 1 with AMX; None on CUDA."""
    if device.type == "cuda":
        return None
    import time

    def seconds(dtype: torch.dtype) -> float:
        a = torch.randn(256, 256).to(dtype)
        a @ a  # warm-up
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - t0)
        return min(times)  # the least disturbed by other work on the machine

    # One thread: both dtypes on one core, so that threads fighting over a busy machine's
    # cores (which hurts the multi-threaded fp32 kernel most) do not skew the ratio.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return seconds(torch.bfloat16) / max(seconds(torch.float32), 1e-9)
    finally:
        torch.set_num_threads(threads)


def resolve_device(setting: str, local_rank: int = 0) -> torch.device:
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("train.device=cuda but no CUDA device is visible; use cpu or auto")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={local_rank} but only {torch.cuda.device_count()} CUDA device(s) "
                "are visible: start at most one rank per GPU (torchrun --nproc_per_node)"
            )
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def resolve_autocast(setting: str, device: torch.device) -> torch.dtype | None:
    """`train.autocast` as a dtype; None means plain fp32."""
    if setting == "auto":
        return torch.bfloat16 if bf16_matmul_is_fast(device) else None
    return torch.bfloat16 if setting == "bf16" else None


def resolve_backend(setting: str, device: torch.device) -> str:
    """`dist.backend` as a backend name: auto -> nccl on CUDA, gloo on CPU."""
    if setting == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if setting == "nccl" and device.type != "cuda":
        raise ValueError(f"dist.backend=nccl needs a CUDA device, but this rank runs on {device}")
    return setting


# `dist.fsdp_param_dtype`: the dtype parameters are all-gathered and computed in under fsdp
PARAM_DTYPE_OF = {"auto": None, "bf16": torch.bfloat16, "fp32": torch.float32}


def resolve_param_dtype(setting: str, device: torch.device) -> torch.dtype:
    """`dist.fsdp_param_dtype` for `device`: auto = bf16 on CUDA, fp32 elsewhere (a CPU
    gains nothing from halving loopback traffic, and fp32 keeps CPU runs comparable)."""
    if setting not in PARAM_DTYPE_OF:
        raise ValueError(f"dist.fsdp_param_dtype must be one of {sorted(PARAM_DTYPE_OF)}")
    dtype = PARAM_DTYPE_OF[setting]
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return dtype


def init_runtime(device: str, autocast: str) -> Runtime:
    """Read the rank layout from torchrun's environment and pick the device and precision."""
    rank = int(os.environ.get("RANK", 0))
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    return Runtime(rank, world_size, local_rank, dev, resolve_autocast(autocast, dev))


@contextmanager
def cpu_threads(threads: int, device: torch.device) -> Iterator[None]:
    """torch's intra-op threads set to `threads` (train.threads) for the block on a CPU, and
    put back after it (a caller such as a test runner keeps its own); 0 leaves them."""
    if threads <= 0 or device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every random generator's state (python, numpy, torch CPU and CUDA), as plain types
    and tensors so it loads with `torch.load(weights_only=True)`."""
    np_state = np.random.get_state(legacy=False)
    return {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Restore what `rng_state` returned (a CUDA state only onto a CUDA device)."""
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def _as_tuples(x: Any) -> Any:
    # random.setstate wants the nested tuples getstate gave; a round trip may yield lists.
    return tuple(_as_tuples(v) for v in x) if isinstance(x, list | tuple) else x
