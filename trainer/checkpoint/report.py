"""What rank 0 says of a checkpoint: that it was saved (where, how big, how long) or resumed
from (at what progress, on how many ranks), and when a CPU run resumes on another thread count
than it saved with."""

import logging
import time
from pathlib import Path
from typing import Any

import torch

from trainer.observe.progress import Progress
from trainer.runtime import Runtime

log = logging.getLogger("train")


def log_saved(step: int, path: Path, t0: float) -> None:
    """The line of a save that began at `t0` (a time.perf_counter())."""
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    log.info(
        "checkpoint step %d: %s (%.1f MB in %.0f ms)",
        step, path, size / 1e6, (time.perf_counter() - t0) * 1000,
    )  # fmt: skip


def log_resumed(path: Path, progress: Progress, meta: dict[str, Any], rt: Runtime) -> None:
    """The line of a resume from `path` (whose meta.json is `meta`), and the thread warning."""
    log.info(
        "resumed from %s: step %d, %d tokens, train time %.1fs (saved on %s, running on %s)",
        path, progress.step, progress.tokens, progress.train_time_s,
        ranks(meta.get("world_size")), ranks(rt.world_size),
    )  # fmt: skip
    warn_threads(meta, rt)


def warn_threads(meta: dict[str, Any], rt: Runtime) -> None:
    """Say so when a CPU run resumes on another number of torch threads per rank: the
    bitwise promise of a resume (docs/checkpoints.md, "Exact resume") holds for the same one."""
    saved, now = meta.get("threads"), torch.get_num_threads()
    if rt.device.type != "cpu" or saved is None or saved == now:
        return
    log.warning(
        "this run computes with %d torch thread(s) per rank, the checkpoint's with %d: on "
        "some CPUs a kernel's sums depend on the thread count, so the losses may differ in "
        "their last bits from a run that never stopped. train.threads=%d matches it.",
        now, saved, saved,
    )  # fmt: skip


def ranks(n: int | None) -> str:
    return "an unknown number of ranks" if n is None else f"{n} rank" + ("s" if n != 1 else "")
