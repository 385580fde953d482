"""The training loop: step, schedule, evaluate on a fixed token budget, log, checkpoint.

Train time is wall-clock time spent in training steps only; evaluation and checkpointing are
excluded, the way public speedrun records are timed. Losses are reduced over all ranks, so the
logged curve is the same whatever the number of ranks or micro-steps that computed it.

The loop starts from a `Progress` (step 0, or where a checkpoint left off) and saves at
`train.checkpoint_every`, at the end, and when a SIGTERM/SIGINT asks it to stop. Every rank
makes the same decisions: the stop request travels with the loss in the one all-reduce each
step already does, and a non-finite loss is judged on that reduced value.
"""

import math
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import Tensor, nn

from optim import apply_schedules
from optim.config import OptimConfig
from trainer.config import TrainConfig
from trainer.dist import all_reduce_sum
from trainer.fault import Faults
from trainer.metrics import MetricsSink, format_step
from trainer.runtime import Runtime
from trainer.signals import Stopped, StopRequests
from trainer.snapshot import Checkpointer, Progress

Batch = tuple[Tensor, Tensor]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], rt: Runtime) -> float:
    """Mean loss over every validation token, whatever the batch size or world size.

    Each rank sums (token loss, token count) over its share; one all-reduce adds them up.
    """
    was_training = model.training
    model.eval()
    totals = torch.zeros(2, dtype=torch.float64, device=rt.device)  # [loss sum, tokens]
    for x, y in batches:
        x, y = x.to(rt.device), y.to(rt.device)
        with rt.autocast():
            loss = model(x, y)
        totals[0] += loss.double() * y.numel()
        totals[1] += y.numel()
    model.train(was_training)
    loss_sum, n_tokens = all_reduce_sum(totals).tolist()
    return loss_sum / n_tokens


class NonFiniteLoss(FloatingPointError):
    """The training loss became NaN or infinite (train.on_nonfinite=stop)."""


def forward_backward(
    model: nn.Module,
    batch: Batch,
    rt: Runtime,
    accum_steps: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
    poison: bool = False,
) -> Tensor:
    """Gradients of this rank's share of the global batch; returns its mean loss (0-d tensor).

    The share is split into `accum_steps` micro-batches of equal size; each contributes
    loss / accum_steps to the gradients, and all but the last skip DDP's gradient all-reduce
    (`no_sync`), so the one all-reduce averages the whole global batch. `poison` makes the
    loss NaN (fault injection for tests).
    """
    x, y = (t.to(rt.device, non_blocking=True) for t in batch)
    loss_sum = torch.zeros((), device=rt.device)
    for k, (xm, ym) in enumerate(zip(x.chunk(accum_steps), y.chunk(accum_steps), strict=True)):
        last = k == accum_steps - 1
        with nullcontext() if last or no_sync is None else no_sync():
            with rt.autocast():
                loss = model(xm, ym)
            if poison:
                loss = loss * float("nan")
            (loss / accum_steps).backward()
        loss_sum += loss.detach()
    return loss_sum / accum_steps


def _step(optimizers: list[torch.optim.Optimizer], update: bool = True) -> None:
    if update:
        for opt in optimizers:
            opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)


def _global(loss: Tensor, stop: bool, rt: Runtime) -> tuple[float, bool]:
    """The mean loss over ranks and whether any rank was asked to stop: one all-reduce."""
    both = torch.stack([loss.float(), torch.tensor(float(stop), device=rt.device)])
    loss_sum, stops = all_reduce_sum(both).tolist()
    return loss_sum / rt.world_size, stops > 0


def run(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    next_batch: Callable[[], Batch],
    val_batches: Callable[[], Iterable[Batch]],
    train_cfg: TrainConfig,
    optim_cfg: OptimConfig,
    rt: Runtime,
    sink: MetricsSink,
    *,
    accum_steps: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
    start: Progress | None = None,
    checkpoints: Checkpointer | None = None,
    stop: StopRequests | None = None,
    faults: Faults | None = None,
) -> float:
    """Train from `start` (default: step 0) to `train_cfg.steps`; return the final val loss.

    `no_sync` is the DDP wrapper's `no_sync` (None in a single process). Raises `Stopped`
    after saving a checkpoint when `stop` caught a signal, and `NonFiniteLoss` on a NaN/inf
    loss under train.on_nonfinite=stop.
    """
    p = start or Progress()
    steps = train_cfg.steps
    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len
    skip_nonfinite = train_cfg.on_nonfinite == "skip"
    if p.step == 0:
        p.val_loss = evaluate(model, val_batches(), rt)
        sink.write({"step": 0, "val_loss": p.val_loss, "tokens": 0, "train_time_ms": 0.0})
        sink.info(format_step({"step": 0, "val_loss": p.val_loss, "train_time_ms": 0.0}, steps))
    target = train_cfg.target_val_loss
    reached = bool(target) and p.val_loss is not None and p.val_loss <= target
    model.train()
    for step in range(p.step + 1, steps + 1):
        if reached:  # resumed from the save made when the target was reached
            break
        rt.synchronize()
        t0 = time.perf_counter()
        lr_mult = apply_schedules(optimizers, step - 1, steps, optim_cfg)
        poison = faults is not None and faults.poisons(step)
        loss_t = forward_backward(model, next_batch(), rt, accum_steps, no_sync, poison)
        if not skip_nonfinite:  # update first: no host sync between backward and step
            _step(optimizers)
        loss, stop_now = _global(loss_t, stop is not None and stop.requested is not None, rt)
        finite = math.isfinite(loss)
        if skip_nonfinite:
            _step(optimizers, update=finite)
        rt.synchronize()
        dt = time.perf_counter() - t0
        p.step, p.tokens, p.train_time_s = step, p.tokens + tokens_per_step, p.train_time_s + dt
        if not finite and not skip_nonfinite:
            raise NonFiniteLoss(_nonfinite_message(loss, step, checkpoints))
        rec = {
            "step": step,
            "train_loss": loss if finite else None,
            "lr": optimizers[0].param_groups[0]["lr"],  # Muon's (or AdamW's hidden) LR
            "lr_mult": lr_mult,
            "tokens": p.tokens,
            "train_time_ms": p.train_time_s * 1000,
            "step_ms": dt * 1000,
            "tokens_per_s": tokens_per_step / dt,
        }
        if not finite:
            p.skipped_steps += 1
            rec["skipped"] = True
            sink.warning("step %d: non-finite loss %s, update skipped", step, loss)
        if step == steps or (train_cfg.val_every and step % train_cfg.val_every == 0):
            p.val_loss = evaluate(model, val_batches(), rt)
            rec["val_loss"] = p.val_loss
            reached = bool(target) and p.val_loss <= target
            if reached:
                rec["target_reached"] = True
        sink.write(rec)
        if step % train_cfg.log_every == 0 or "val_loss" in rec:
            sink.info(format_step(rec, steps))
        if faults is not None:
            faults.after_step(step)
        if reached:
            sink.info(
                "target val loss %.4f reached at step %d: %.4f after %.1fs of training (%d tokens)",
                target, step, p.val_loss, p.train_time_s, p.tokens,
            )  # fmt: skip
        every = train_cfg.checkpoint_every
        last = step == steps or reached
        due = (every and step % every == 0) or (last and train_cfg.checkpoint_at_end)
        if checkpoints is not None and (due or stop_now):
            checkpoints.save(p)
        if stop_now:
            signal_name = (stop.requested if stop else None) or "a signal on another rank"
            raise Stopped(signal_name, step, str(checkpoints.last if checkpoints else None))
        if reached:
            break
    if p.val_loss is None:  # resumed from a save without a val loss, with nothing left to do
        p.val_loss = evaluate(model, val_batches(), rt)
    skipped = f", {p.skipped_steps} steps skipped (non-finite loss)" if p.skipped_steps else ""
    sink.info(
        "done: %d steps, %d tokens, final val loss %.4f, train time %.1fs (%.0f ms/step)%s",
        p.step,
        p.tokens,
        p.val_loss,
        p.train_time_s,
        p.train_time_s * 1000 / max(p.step, 1),
        skipped,
    )
    return p.val_loss


def _nonfinite_message(loss: float, step: int, checkpoints: Checkpointer | None) -> str:
    last = checkpoints.last if checkpoints is not None else None
    where = (
        f"the last good checkpoint is {last} (resume from it with train.resume={last}, "
        "perhaps with a lower LR)"
        if last
        else "no checkpoint was saved before it"
    )
    return (
        f"non-finite training loss ({loss}) at step {step}; stopped without saving: {where}. "
        "train.on_nonfinite=skip drops such steps' updates instead"
    )
