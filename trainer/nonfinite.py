"""A step whose loss or gradient is NaN or infinite: `train.on_nonfinite`, in one place.

stop (default): the run stops at that step, saving nothing, and the message names the last
good checkpoint. skip: the step's update is dropped and the run goes on.

The judgement costs no host sync of its own: the gradient check is a device-side flag (the
2-norm over every gradient is finite iff each one is, unless it overflows float range, which
counts as non-finite too), reduced over ranks together with the loss in the one all-reduce
each step already does, so every rank decides the same way.
"""

import math
from pathlib import Path

import torch
from torch import Tensor

from optim.fsdp_rows import local
from trainer.observe.metrics import MetricsSink
from trainer.observe.progress import Progress


class NonFiniteStep(FloatingPointError):
    """The training loss or a gradient became NaN or infinite (train.on_nonfinite=stop)."""


def nonfinite_grads(params: list[Tensor]) -> Tensor:
    """1.0 if any gradient of `params` holds a NaN or infinity, else 0.0, on their device."""
    # A sharded gradient is checked on this rank's shard: the flag is summed over ranks.
    grads = [local(p.grad) for p in params if p.grad is not None]
    if not grads:
        return torch.zeros((), device=params[0].device if params else None)
    norm = torch.nn.utils.get_total_norm(grads, 2.0)
    return (~torch.isfinite(norm)).float()


def describe(loss: float, grads_finite: bool) -> str:
    """What went wrong: "training loss (nan)" or "gradient (the loss, 3.2, is finite)"."""
    if grads_finite:
        return f"training loss ({loss})"
    if math.isfinite(loss):
        return f"gradient (the loss, {loss:.4f}, is finite)"
    return f"training loss ({loss}) and gradient"


def stop_message(loss: float, grads_finite: bool, step: int, last: Path | None) -> str:
    where = (
        f"the last good checkpoint is {last} (resume from it with train.resume={last}, "
        "perhaps with a lower LR)"
        if last
        else "no checkpoint was saved before it"
    )
    return (
        f"non-finite {describe(loss, grads_finite)} at step {step}; stopped without saving: "
        f"{where}. train.on_nonfinite=skip drops such steps' updates instead"
    )


def on_nonfinite(
    p: Progress, rec: dict, loss: float, grads_finite: bool, action: str, last: Path | None,
    sink: MetricsSink,
) -> None:  # fmt: skip
    """Step `p.step` had a NaN/inf loss or gradient: under `action` (train.on_nonfinite) "stop"
    raise `NonFiniteStep` (saving nothing; `last`: the newest checkpoint), else count the
    skipped step in `p` and `rec` and say so."""
    if action == "stop":
        raise NonFiniteStep(stop_message(loss, grads_finite, p.step, last))
    p.skipped_steps += 1
    rec["skipped"] = True
    what = "loss" if grads_finite else "gradient"
    sink.warning("step %d: non-finite %s (loss %s), update skipped", p.step, what, loss)
