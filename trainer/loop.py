"""The training loop: step, schedule, evaluate on a fixed token budget, log.

Train time is wall-clock time spent in training steps only; evaluation is excluded, the
way public speedrun records are timed. Losses are reduced over all ranks, so the logged curve
is the same whatever the number of ranks or micro-steps that computed it.
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
from trainer.dist import all_reduce_sum, world_mean
from trainer.metrics import MetricsSink, format_step
from trainer.runtime import Runtime

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


def train_step(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    batch: Batch,
    rt: Runtime,
    accum_steps: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
) -> float:
    """One optimizer step on this rank's share of the global batch; returns the global loss.

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
                loss = model(xm, ym)
            (loss / accum_steps).backward()
        loss_sum += loss.detach()
    for opt in optimizers:
        opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return world_mean(loss_sum / accum_steps).item()


def run(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    next_batch: Callable[[], Batch],
    val_batches: Callable[[], Iterable[Batch]],
    train_cfg: TrainConfig,
    optim_cfg: OptimConfig,
    rt: Runtime,
    sink: MetricsSink,
    accum_steps: int = 1,
    no_sync: Callable[[], AbstractContextManager] | None = None,
) -> float:
    """Train for `train_cfg.steps` steps; return the final validation loss.

    `no_sync` is the DDP wrapper's `no_sync` (None in a single process).
    """
    steps = train_cfg.steps
    tokens_per_step = train_cfg.batch_size * train_cfg.seq_len
    train_time = 0.0
    val_loss = evaluate(model, val_batches(), rt)
    sink.write({"step": 0, "val_loss": val_loss, "tokens": 0, "train_time_ms": 0.0})
    sink.info(format_step({"step": 0, "val_loss": val_loss, "train_time_ms": 0.0}, steps))
    model.train()
    for step in range(1, steps + 1):
        rt.synchronize()
        t0 = time.perf_counter()
        lr_mult = apply_schedules(optimizers, step - 1, steps, optim_cfg)
        loss = train_step(model, optimizers, next_batch(), rt, accum_steps, no_sync)
        rt.synchronize()
        dt = time.perf_counter() - t0
        train_time += dt
        if not math.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss} at step {step}")
        rec = {
            "step": step,
            "train_loss": loss,
            "lr": optimizers[0].param_groups[0]["lr"],  # Muon's (or AdamW's hidden) LR
            "lr_mult": lr_mult,
            "tokens": step * tokens_per_step,
            "train_time_ms": train_time * 1000,
            "step_ms": dt * 1000,
            "tokens_per_s": tokens_per_step / dt,
        }
        if step == steps or (train_cfg.val_every and step % train_cfg.val_every == 0):
            val_loss = evaluate(model, val_batches(), rt)
            rec["val_loss"] = val_loss
        sink.write(rec)
        if step % train_cfg.log_every == 0 or "val_loss" in rec:
            sink.info(format_step(rec, steps))
    sink.info(
        "done: %d steps, %d tokens, final val loss %.4f, train time %.1fs (%.0f ms/step)",
        steps,
        steps * tokens_per_step,
        val_loss,
        train_time,
        train_time * 1000 / steps,
    )
    return val_loss
