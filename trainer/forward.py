"""A batch through the model: the training forward/backward with gradient accumulation, and
the evaluation over a fixed token budget (the loop's two uses of the model)."""

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from data.loader import Batch
from trainer.launch.dist import all_reduce_sum
from trainer.runtime import Runtime


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    rt: Runtime,
    model_args: dict | None = None,
    stop: Callable[[], bool] | None = None,
    progress: Callable[[int], None] | None = None,
) -> float | None:
    """Mean loss over every validation token, whatever the batch size or world size.

    Each rank sums (token loss, token count) over its share; one all-reduce adds them up.
    `model_args`: the step-dependent forward arguments (the attention window). `stop`: asked
    between batches; once true this rank skips its remaining batches, and when any rank did,
    every rank gets None (the flag travels in the same all-reduce, so no rank waits on a
    batch another skipped). `progress(k)`: called after the k-th batch.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=rt.device)  # loss sum, tokens, stops
    for k, (x, y) in enumerate(batches, 1):
        if stop is not None and stop():
            totals[2] = 1
            break
        x, y = x.to(rt.device), y.to(rt.device)
        with rt.autocast():
            loss = model(x, y, **(model_args or {}))
        totals[0] += loss.double() * y.numel()
        totals[1] += y.numel()
        if progress is not None:
            progress(k)
    model.train(was_training)
    loss_sum, n_tokens, stops = all_reduce_sum(totals).tolist()
    return None if stops else loss_sum / n_tokens


def forward_backward(
    model: nn.Module,
    batch: Batch,
    rt: Runtime,
    accum_steps: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
    model_args: dict | None = None,
) -> Tensor:
    """Gradients of this rank's share of the global batch; returns its mean loss (0-d tensor).

    The share is split into `accum_steps` micro-batches of equal size; each contributes
    loss / accum_steps to the gradients, and all but the last skip DDP's gradient all-reduce
    (`no_sync`), so the one all-reduce averages the whole global batch.
    """
    x, y = (t.to(rt.device, non_blocking=True) for t in batch)
    loss_sum = torch.zeros((), device=rt.device)
    for k, (xm, ym) in enumerate(zip(x.chunk(accum_steps), y.chunk(accum_steps), strict=True)):
        last = k == accum_steps - 1
        with nullcontext() if last or no_sync is None else no_sync():
            with rt.autocast():
                loss = model(xm, ym, **(model_args or {}))
            (loss / accum_steps).backward()
        loss_sum += loss.detach()
    return loss_sum / accum_steps
