"""One optimizer step on this rank: the schedule's values for the step (trainer/schedule.py:
the optimizer's values and the model's forward arguments), the batch, forward/backward over
the micro-batches, the step hook (test faults), the update, and one all-reduce that brings
every rank the mean loss, whether any gradient is non-finite, whether any rank was asked to
stop and the step's FLOPs over all ranks (for MFU): the step's one host sync, which everything
the step reads back shares.
"""

import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from data.loader import Batch
from model.config.kernel_step import KernelStep
from optim import CombinedOptimizer
from trainer.forward import forward_backward
from trainer.launch.dist import all_reduce_sum
from trainer.nonfinite import nonfinite_grads
from trainer.runtime import Runtime
from trainer.schedule import Schedule

# Called once per step after forward/backward, before the update, with the step (1-based)
# and its loss; returns the loss to use. The seam for test-only faults (trainer/launch/fault.py).
StepHook = Callable[[int, Tensor], Tensor]


@dataclass(frozen=True)
class StepDone:
    """What a step brings back: what its one all-reduce gave every rank, and its time."""

    loss: float  # the mean over ranks
    grads_finite: bool  # on every rank
    stop: bool  # some rank was asked to stop
    flops: float | None  # the step's FLOPs over all ranks; None: not counted
    seconds: float  # wall-clock, queued device work included
    lr_mult: float  # the schedule's LR multiplier

    @property
    def finite(self) -> bool:
        return math.isfinite(self.loss) and self.grads_finite


@dataclass
class TrainStep:
    """One optimizer step, `step(n, asked)`: set the schedule's values, move the batch to the
    device, forward/backward, the hook, the update (after the reduction under
    train.on_nonfinite=skip, which drops a non-finite step's update), the reduction."""

    model: nn.Module  # what runs forward: the model, or its DDP / compiled wrapper
    optimizer: CombinedOptimizer
    schedule: Schedule
    next_batch: Callable[..., Batch]  # this rank's share of the next global batch (of a length)
    rt: Runtime
    seq_len: int  # train.seq_len: a step of this length asks the loader for its default
    accum_steps: int = 1
    no_sync: Callable[[], AbstractContextManager] | None = None  # DDP's; None in one process
    hook: StepHook | None = None
    # A batch's training FLOPs as a device scalar, from its tokens and the forward's step
    # arguments (model/flops.py); None: no MFU to give (CPU, unknown GPU)
    flops: Callable[..., Tensor] | None = None
    # The training loss is a sum over tokens (model.head.reduction=sum): logged per token
    summed_loss: bool = False
    skip_nonfinite: bool = False  # train.on_nonfinite=skip
    # The forward's step arguments as device tensors, kept while their value holds
    _args: dict[str, tuple[float | tuple[float, ...], Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )

    def __call__(self, step: int, asked: Callable[[], bool]) -> StepDone:
        """Take step `step` (1-based); `asked()`: whether this rank was asked to stop."""
        self.rt.synchronize()
        t0 = time.perf_counter()
        values = self.schedule.at(step - 1)
        self.optimizer.set_step(values.optim)
        # The step's sequence length (its stage's, train.stages), when the schedule varies it
        seq = (values.seq_len,) if values.seq_len and values.seq_len != self.seq_len else ()
        # The step's piece cap and limit (its stage's), where the stage table sets them
        host = self.next_batch(*seq, **values.data_args)
        batch = tuple(t.to(self.rt.device, non_blocking=True) for t in host)
        args = self.on_device(values.model_args)
        # Counted over the rank's whole batch at once: micro-batches split it by rows, and a
        # row's count does not depend on the others, so this is their sum.
        flops = self.flops(batch[0], **args) if self.flops is not None else None
        loss = forward_backward(self.model, batch, self.rt, self.accum_steps, self.no_sync, args)
        if self.summed_loss:  # the model summed over each micro-batch's tokens: log the mean
            loss = loss / (batch[0].numel() // self.accum_steps)
        if self.hook is not None:
            loss = self.hook(step, loss)
        bad_grads = nonfinite_grads(self.optimizer.params())
        if not self.skip_nonfinite:  # update first: no host sync between backward and the update
            self.optimizer.step()
        mean, grads_finite, stop, flops_all = reduce_step(
            loss, bad_grads, asked(), flops, self.rt.world_size
        )
        if self.skip_nonfinite and math.isfinite(mean) and grads_finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.rt.synchronize()
        dt = time.perf_counter() - t0
        counted = flops_all if flops is not None else None
        return StepDone(mean, grads_finite, stop, counted, dt, values.optim.lr_mult)

    def on_device(self, args: dict[str, float | tuple[float, ...]]) -> dict[str, Tensor]:
        """The schedule's forward arguments as device tensors (a changing Python number would
        make a compiled model recompile): a number as a 0-d tensor, a tuple (the MTP weights)
        as a 1-D one. Each is filled in on the device, not copied from the host (a copy waits
        for the queued work), and reused while its value holds. The varlen kernel's
        `KernelStep` stays Python: the kernel takes Python numbers, and they change only with
        the stage, where the shapes recompile anyway (model/varlen.py)."""
        for key, value in args.items():
            held = self._args.get(key)
            if held is None or held[0] != value:
                # The varlen kernel's Python arguments stay Python (model/varlen.py)
                kept = value if isinstance(value, KernelStep) else filled(value, self.rt.device)
                self._args[key] = (value, kept)
        return {key: self._args[key][1] for key in args}


def filled(value: float | tuple[float, ...], device: torch.device) -> Tensor:
    """`value` as a float64 tensor on `device`, each entry filled in there (`on_device`)."""
    if not isinstance(value, tuple):
        return torch.full((), value, dtype=torch.float64, device=device)
    out = torch.empty(len(value), dtype=torch.float64, device=device)
    for i, v in enumerate(value):
        out[i].fill_(v)
    return out


def reduce_step(
    loss: Tensor, bad_grads: Tensor, asked: bool, flops: Tensor | None, world_size: int
) -> tuple[float, bool, bool, float]:
    """The mean loss over ranks, whether every rank's gradients are finite, whether any rank
    was asked to stop, and the step's FLOPs summed over ranks: one all-reduce, the step's one
    host sync. The flag and a missing count are filled in on the device (a host-to-device
    copy would wait for the queued step first)."""
    flags = torch.stack([
        loss.float(), bad_grads, torch.full_like(bad_grads, float(asked)),
        flops.float() if flops is not None else torch.zeros_like(bad_grads),
    ])  # fmt: skip
    loss_sum, bad, stops, flops_sum = all_reduce_sum(flags).tolist()
    return loss_sum / world_size, bad == 0, stops > 0, flops_sum
