"""What the console shows of a run, on rank 0: the startup line (`describe_run`), one line per
logged step (`format_step`, and `StepLog`, which decides when a step gets one), the target
line and the closing summary (`run_summary`)."""

import time
from typing import Any

import torch
from torch import nn

from optim.parallelism import PARALLELISMS
from trainer.config import Config, TrainConfig
from trainer.observe.metrics import MetricsSink
from trainer.observe.progress import Progress
from trainer.runtime import Runtime, resolve_param_dtype

# The longest a run goes without a console line, whatever train.log_every says.
QUIET_S = 30.0


class StepLog:
    """Every record into the sink; a console line every log_every steps, at every evaluation,
    at the first step, and at least every QUIET_S seconds: a slow run with a sparse log_every
    must still show it is alive."""

    def __init__(self, sink: MetricsSink, cfg: TrainConfig) -> None:
        self.sink, self.cfg = sink, cfg
        self._logged_at = time.monotonic()

    def write(self, rec: dict) -> None:
        self.sink.write(rec)
        now = time.monotonic()
        if (
            rec["step"] % self.cfg.log_every == 0
            or "val_loss" in rec
            or rec["step"] == 1
            or now - self._logged_at >= QUIET_S
        ):
            self.sink.info(format_step(rec, self.cfg.steps))
            self._logged_at = now
        if rec.get("target_reached"):
            self.sink.info(
                "target val loss %.4f reached at step %d: %.4f after %.1fs of training (%d tokens)",
                self.cfg.target_val_loss, rec["step"], rec["val_loss"], rec["train_time_ms"] / 1e3,
                rec["tokens"],
            )  # fmt: skip


def run_summary(p: Progress, untimed_steps: int) -> str:
    """The closing line: steps, tokens, final val loss, train time, skipped steps."""
    timed = p.step - untimed_steps
    if timed > 0:
        timing = f"train time {p.train_time_s:.1f}s ({p.train_time_s * 1000 / timed:.0f} ms/step)"
    else:  # a short run (a record preset's toy) that never left the records' untimed steps
        timing = (
            f"train time not measured: all {p.step} steps are within train.untimed_steps="
            f"{untimed_steps}, the warm-up the records leave out of their time"
        )
    if untimed_steps and p.untimed_s:  # a save from before untimed_s was kept has none
        timing += f" ({min(p.step, untimed_steps)} untimed steps took {p.untimed_s:.1f}s)"
    skipped = f", {p.skipped_steps} steps skipped (non-finite)" if p.skipped_steps else ""
    return (
        f"done: {p.step} steps, {p.tokens} tokens, final val loss {p.val_loss:.4f}, "
        f"{timing}{skipped}"
    )


def format_step(rec: dict[str, Any], total_steps: int) -> str:
    """The console line for one step: loss, LR, speed, and the val loss when evaluated."""
    parts = [f"step {rec['step']:>{len(str(total_steps))}}/{total_steps}"]
    if "train_loss" in rec:
        loss = rec["train_loss"]
        parts.append("loss non-finite (skipped)" if loss is None else f"loss {loss:.4f}")
    if "val_loss" in rec:
        parts.append(f"val {rec['val_loss']:.4f}")
    if "reference_val_loss" in rec:  # the reference curve at these tokens (train.reference)
        parts.append(f"reference {rec['reference_val_loss']:.4f}")
    if "lr_mult" in rec:
        parts.append(f"lr x{rec['lr_mult']:.3g}")
    if "step_ms" in rec:
        parts.append(f"{rec['step_ms']:.0f} ms/step")
    if "tokens_per_s" in rec:
        parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    if "mfu" in rec:
        parts.append(f"mfu {rec['mfu']:.1%}")
    if "peak_mem_gib" in rec:
        parts.append(f"mem {rec['peak_mem_gib']:.1f} GiB")
    parts.append(f"train {rec['train_time_ms'] / 1000:.1f}s")
    if rec.get("eta_s"):
        parts.append(f"eta {_duration(rec['eta_s'])}")
    if "target_eta_s" in rec:
        parts.append(f"to target ~{_duration(rec['target_eta_s'])}")
    return " | ".join(parts)


def _duration(seconds: float) -> str:
    """3m05s, 1h02m, 42s: the ETA at a glance."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def describe_run(
    conf: Config, rt: Runtime, model: nn.Module, optimizer: str, accum_steps: int
) -> str:
    """The startup line: model, optimizer, ranks, precision and how a step's tokens split."""
    m, t = conf.model, conf.train
    n_params = sum(p.numel() for p in model.parameters())
    tp = conf.dist.tensor_parallel  # the ranks of a TP group share one batch
    micro = t.micro_batch(rt.data_world)
    precision = "bf16 autocast" if rt.autocast_dtype else "fp32"
    if m.numerics.dtype == "bf16":
        precision = f"bf16 model ({precision} for the rest)"
    ranks = count = f"{rt.world_size} rank" + ("s" if rt.world_size > 1 else "")
    where = rt.device.type
    if where == "cpu":  # what a bitwise comparison must match (docs/checkpoints.md, "Exact resume")
        threads = torch.get_num_threads()
        where += f" ({threads} thread{'s' if threads > 1 else ''}/rank)"
    if PARALLELISMS[conf.dist.parallelism].fsdp:
        dtype = resolve_param_dtype(conf.dist.fsdp_param_dtype, rt.device)
        ranks += f" ({conf.dist.parallelism}, parameters in {str(dtype).removeprefix('torch.')}"
        ranks += f", tensor parallel over {tp})" if tp > 1 else ")"
    if tp > 1:
        groups = rt.data_world
        count = f"{groups} group{'s' if groups > 1 else ''} of {tp} tensor-parallel ranks"
    return (
        (
            f"model {m.n_layer} layers, d {m.n_embd}, {m.n_head} heads: {n_params:,} "
            f"parameters | {optimizer} | {ranks} on {where}, {precision} | "
            f"{t.batch_size * t.seq_len} tokens/step = {count} x {accum_steps} micro-step"
            f"{'s' if accum_steps > 1 else ''} "
            f"x {micro} x {t.seq_len}"
        )
        + (
            f" at the most; by stage {', '.join(str(t.batch_size * n) for n in lengths)}"
            if (lengths := t.stages.column("seq_len"))
            else ""
        )
        + (f"\nlayers: {plan}" if (plan := model.plan_summary()) else "")
    )


def tie_outlasts_run(conf: Config) -> str | None:
    """A warning when the token table and the head are never updated apart: their first separate
    Adam update (optim.tie_embed_head_until + optim.adamw.update_every) is past the run's last step.
    A shortened record run (train.steps=100 on record_2026_07_17's preset, whose tie ends at 921)
    keeps the pair tied throughout, which is allowed but rarely meant."""
    until, steps = conf.optim.tie_embed_head_until, conf.train.steps
    apart = until + conf.optim.adamw.update_every
    if not until or apart < steps:
        return None
    return (
        f"optim.tie_embed_head_until={until}: the token table and the head would first be "
        f"updated apart at step {apart}, past this run's last ({steps - 1}, train.steps="
        f"{steps}), so they stay tied for the whole run; set it below {steps - apart + until} "
        "to split them"
    )


def qk_clip_without_effect(conf: Config) -> str | None:
    """A warning when QK-clip can change no logit: with QK-norm q and k are RMS-normalised
    before the logits, so rescaling W_q and W_k leaves the next logits as they were
    (optim/qk_clip.py). The clip still rescales the weights, which is allowed but rarely meant."""
    tau = conf.optim.muon.qk_clip
    if not tau or not conf.model.attention.qk_norm:
        return None
    return (
        f"optim.muon.qk_clip={tau:g} bounds no logit here: model.attention.qk_norm=true "
        "normalises q and k, so scaling W_q and W_k leaves the logits unchanged; set "
        "model.attention.qk_norm=false for QK-clip to act, or optim.muon.qk_clip=0"
    )
