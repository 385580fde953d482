"""The training loop: step, schedule, evaluate on a fixed token budget, log.

Train time is wall-clock time spent in training steps only; evaluation is excluded, the
way public speedrun records are timed.
"""

import math
import time
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn

from optim import apply_schedules
from optim.config import OptimConfig
from trainer.config import TrainConfig
from trainer.metrics import MetricsSink, format_step
from trainer.runtime import Runtime

Batch = tuple[Tensor, Tensor]


@torch.no_grad()
def evaluate(model: nn.Module, batches: Iterable[Batch], rt: Runtime) -> float:
    """Mean loss over every validation token, whatever the batch size or world size."""
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=rt.device)
    n_tokens = 0
    for x, y in batches:
        x, y = x.to(rt.device), y.to(rt.device)
        with rt.autocast():
            loss = model(x, y)
        loss_sum += loss.double() * y.numel()
        n_tokens += y.numel()
    model.train(was_training)
    return (loss_sum / n_tokens).item()


def train_step(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    batch: Batch,
    rt: Runtime,
) -> float:
    """One optimizer step on this rank's share of the global batch; returns its mean loss."""
    x, y = (t.to(rt.device, non_blocking=True) for t in batch)
    with rt.autocast():
        loss = model(x, y)
    loss.backward()
    for opt in optimizers:
        opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return loss.item()


def run(
    model: nn.Module,
    optimizers: list[torch.optim.Optimizer],
    next_batch: Callable[[], Batch],
    val_batches: Callable[[], Iterable[Batch]],
    train_cfg: TrainConfig,
    optim_cfg: OptimConfig,
    rt: Runtime,
    sink: MetricsSink,
) -> float:
    """Train for `train_cfg.steps` steps; return the final validation loss."""
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
        loss = train_step(model, optimizers, next_batch(), rt)
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
