"""The training loop: step, schedule, evaluate on a fixed token budget, log, checkpoint.

One step is: the run's schedule for the step (trainer/schedule.py: the optimizer's values
and the model's forward arguments), forward/backward over the micro-batches, the step hook
(test faults), the update, and one all-reduce that brings every rank the mean loss, whether
any gradient is non-finite, whether any rank was asked to stop and the step's FLOPs over all
ranks (for MFU): the step's one host sync, which everything the step reads back shares.
Then, when due: evaluation (and the target check), the log line, a checkpoint.

Train time is wall-clock time spent in training steps only; evaluation and checkpointing are
excluded, the way public speedrun records are timed. Losses are reduced over all ranks, so the
logged curve is the same whatever the number of ranks or micro-steps that computed it.
"""

import math
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from data.loader import Batch
from optim import CombinedOptimizer
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.config import TrainConfig
from trainer.forward import evaluate, forward_backward
from trainer.launch.dist import all_reduce_sum
from trainer.launch.signals import Stopped, StopRequests
from trainer.nonfinite import NonFiniteStep, nonfinite_grads, stop_message
from trainer.observe.flops import mfu
from trainer.observe.metrics import EvalProgress, MetricsSink, format_step
from trainer.observe.progress import Progress
from trainer.runtime import Runtime
from trainer.schedule import Schedule

# The longest a run goes without a console line, whatever train.log_every says.
QUIET_S = 30.0

# Called once per step after forward/backward, before the update, with the step (1-based)
# and its loss; returns the loss to use. The seam for test-only faults (trainer/launch/fault.py).
StepHook = Callable[[int, Tensor], Tensor]


@dataclass
class Loop:
    """Everything a run steps through; `run()` is the loop."""

    model: nn.Module  # what runs forward: the model, or its DDP / compiled wrapper
    optimizer: CombinedOptimizer
    schedule: Schedule
    next_batch: Callable[..., Batch]  # this rank's share of the next global batch (of a length)
    val_batches: Callable[[], Iterable[Batch]]  # the same validation batches every call
    cfg: TrainConfig
    rt: Runtime
    sink: MetricsSink
    checkpoints: Checkpointer | None = None
    accum_steps: int = 1
    no_sync: Callable[[], AbstractContextManager] | None = None  # DDP's; None in one process
    stop: StopRequests | None = None
    hook: StepHook | None = None
    # A batch's training FLOPs as a device scalar, from its tokens and the forward's step
    # arguments (model/flops.py); with `peak_flops` it gives the step's MFU
    # (trainer/observe/flops.py)
    flops: Callable[..., Tensor] | None = None
    peak_flops: float | None = None  # one GPU's bf16 peak; None: no MFU (CPU, unknown GPU)
    code: dict | None = None  # the code's commit and dirty flag, in the first metrics line
    # The training loss is a sum over tokens (model.loss_reduction=sum): logged per token
    summed_loss: bool = False
    # The forward's step arguments as device tensors, kept while their value holds
    _arg_tensors: dict[str, tuple[float, Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )
    _saved_step: int = field(default=0, init=False, repr=False)  # the newest checkpoint's step
    _logged_at: float = field(default_factory=time.monotonic, init=False, repr=False)

    def run(self, start: Progress | None = None) -> float:
        """Train from `start` (default: step 0) to `train.steps`; return the final val loss.

        Raises `Stopped` after saving a checkpoint when a SIGTERM/SIGINT asked to stop, and
        `NonFiniteStep` on a NaN/inf loss or gradient under train.on_nonfinite=stop.
        """
        p = start or Progress()
        self._saved_step = p.step  # a fresh start has nothing to save, a resume saved this
        if p.step == 0:
            first = {"step": 0, "tokens": 0, "train_time_ms": 0.0}
            if self.code is not None:
                first["code"] = self.code
            if not self._evaluate(p, first):
                self._checkpoint(p, True)  # stopped before any update: nothing saved
            self._log(first)
        self.model.train()
        while p.step < self.cfg.steps and not self._target_reached(p):
            if self._asked_here():
                self._checkpoint(p, True)
            rec, stop_now = self._train_step(p)
            if p.step == self.cfg.steps or (
                self.cfg.val_every and p.step % self.cfg.val_every == 0
            ):
                stop_now = not self._evaluate(p, rec) or stop_now
            self._log(rec)
            self._checkpoint(p, stop_now)
        if p.val_loss is None:  # resumed from a save without a val loss, nothing left to do
            p.val_loss = self._val_loss(p.step)
            if p.val_loss is None:
                self._checkpoint(p, True)
        self.sink.info("%s", self._summary(p))
        return p.val_loss

    def _summary(self, p: Progress) -> str:
        timed = p.step - self.cfg.untimed_steps
        if timed > 0:
            time = f"train time {p.train_time_s:.1f}s ({p.train_time_s * 1000 / timed:.0f} ms/step)"
        else:
            time = f"train time not measured (train.untimed_steps={self.cfg.untimed_steps})"
        skipped = f", {p.skipped_steps} steps skipped (non-finite)" if p.skipped_steps else ""
        return (
            f"done: {p.step} steps, {p.tokens} tokens, final val loss {p.val_loss:.4f}, "
            f"{time}{skipped}"
        )

    def _asked_here(self) -> bool:
        """A stop request this rank can act on before starting a step: in one process only (with
        several, the ranks agree in the step's reduction, which costs no extra sync)."""
        return self.rt.world_size == 1 and self.stop is not None and bool(self.stop.requested)

    def _train_step(self, p: Progress) -> tuple[dict, bool]:
        """One optimizer step; advances `p` and returns the step's record and whether to stop."""
        step = p.step + 1
        self._doing(f"step {step} of {self.cfg.steps}")
        self.rt.synchronize()
        t0 = time.perf_counter()
        values = self.schedule.at(step - 1)
        self.optimizer.set_step(values.optim)
        # The step's sequence length (train.seq_len_phases), when the schedule varies it
        seq = (values.seq_len,) if values.seq_len and values.seq_len != self.cfg.seq_len else ()
        batch = tuple(t.to(self.rt.device, non_blocking=True) for t in self.next_batch(*seq))
        args = self._on_device(values.model_args)
        flops = self._count_flops(batch[0], args)
        loss_t = forward_backward(self.model, batch, self.rt, self.accum_steps, self.no_sync, args)
        if self.summed_loss:  # the model summed over each micro-batch's tokens: log the mean
            loss_t = loss_t / (batch[0].numel() // self.accum_steps)
        if self.hook is not None:
            loss_t = self.hook(step, loss_t)
        bad_grads = nonfinite_grads(self.optimizer.params())
        skip_mode = self.cfg.on_nonfinite == "skip"
        if not skip_mode:  # update first: no host sync between backward and the update
            self.optimizer.step()
        loss, grads_finite, stop_now, flops_all = self._reduce(loss_t, bad_grads, flops)
        finite = math.isfinite(loss) and grads_finite
        if skip_mode and finite:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.rt.synchronize()
        dt = time.perf_counter() - t0
        self._doing(None)
        tokens = self.cfg.step_tokens(step - 1)
        timed = step > self.cfg.untimed_steps  # the records time from step 10 on
        p.step, p.tokens = step, p.tokens + tokens
        p.train_time_s += dt if timed else 0.0
        rec = {
            "step": step,
            "train_loss": loss if math.isfinite(loss) else None,
            "lr_mult": values.optim.lr_mult,
            **{f"lr/{name}": lr for name, lr in self.optimizer.lrs().items()},
            **self.optimizer.stats,
            "tokens": p.tokens,
            "train_time_ms": p.train_time_s * 1000,
            "step_ms": dt * 1000,
            "tokens_per_s": tokens / dt,
        }
        rec.update(self._rates(p, dt, flops_all))
        if not finite:
            self._on_nonfinite(p, rec, loss, grads_finite)
        return rec, stop_now

    def _count_flops(self, x: Tensor, args: dict[str, Tensor]) -> Tensor | None:
        """The step's FLOPs on this rank, a device scalar (None when there is no MFU to give).
        Counted over the rank's whole batch at once: micro-batches split it by rows, and a
        row's count does not depend on the others, so this is their sum."""
        if self.flops is None or not self.peak_flops:
            return None
        return self.flops(x, **args)

    def _rates(self, p: Progress, dt: float, flops: float) -> dict[str, float]:
        """ETA from the mean timed step so far; MFU (from the FLOPs of every rank's batch) and
        peak memory on a GPU."""
        out = {}
        timed = p.step - self.cfg.untimed_steps
        if timed > 0 and p.train_time_s > 0:
            out["eta_s"] = p.train_time_s / timed * (self.cfg.steps - p.step)
        if self.flops is not None and self.peak_flops:
            out["mfu"] = mfu(flops, dt, self.peak_flops, self.rt.world_size)
        if self.rt.device.type == "cuda":
            out["peak_mem_gib"] = torch.cuda.max_memory_allocated(self.rt.device) / 2**30
        return out

    def _reduce(
        self, loss: Tensor, bad_grads: Tensor, flops: Tensor | None
    ) -> tuple[float, bool, bool, float]:
        """The mean loss over ranks, whether every rank's gradients are finite, whether any
        rank was asked to stop, and the step's FLOPs summed over ranks: one all-reduce, the
        step's one host sync. The flag and a missing count are filled in on the device (a
        host-to-device copy would wait for the queued step first)."""
        asked = float(self.stop is not None and self.stop.requested is not None)
        flags = torch.stack([
            loss.float(), bad_grads, torch.full_like(bad_grads, asked),
            flops.float() if flops is not None else torch.zeros_like(bad_grads),
        ])  # fmt: skip
        loss_sum, bad, stops, flops_sum = all_reduce_sum(flags).tolist()
        return loss_sum / self.rt.world_size, bad == 0, stops > 0, flops_sum

    def _on_nonfinite(self, p: Progress, rec: dict, loss: float, grads_finite: bool) -> None:
        """A NaN/inf loss or gradient: stop (raise, saving nothing) or count the skipped step."""
        if self.cfg.on_nonfinite == "stop":
            last = self.checkpoints.last if self.checkpoints is not None else None
            raise NonFiniteStep(stop_message(loss, grads_finite, p.step, last))
        p.skipped_steps += 1
        rec["skipped"] = True
        what = "loss" if grads_finite else "gradient"
        self.sink.warning("step %d: non-finite %s (loss %s), update skipped", p.step, what, loss)

    def _evaluate(self, p: Progress, rec: dict) -> bool:
        """Validation loss into `p` and `rec`, and whether it reached the target; False when a
        stop request cut the evaluation short (`rec` then has no val loss)."""
        val_loss = self._val_loss(p.step)
        if val_loss is None:
            return False
        p.val_loss = rec["val_loss"] = val_loss
        if self._target_reached(p):
            rec["target_reached"] = True
        return True

    def _val_loss(self, step: int) -> float | None:
        """The validation loss after `step` updates, with the schedule's forward arguments
        (None: a stop request cut it short). A long evaluation reports its progress."""
        args = self._on_device(self.schedule.model_args(step))
        stop = None if self.stop is None else lambda: self.stop.requested is not None
        rows = self.cfg.val_rows(self.rt.world_size) * self.rt.world_size
        sequences = self.cfg.val_tokens // (self.cfg.val_seq_len or self.cfg.seq_len)
        batches = math.ceil(sequences / rows)
        report = EvalProgress(self.sink, step, batches) if self.rt.is_main else None
        self._doing(f"the validation after step {step}", "it stops at its next batch")
        try:
            return evaluate(self.model, self.val_batches(), self.rt, args, stop, report)
        finally:
            self._doing(None)

    def _doing(self, what: str | None, until: str = "the run stops when it ends") -> None:
        """Tell the stop requests what runs now, for a request's announcement."""
        if self.stop is not None:
            self.stop.doing(what, until)

    def _on_device(self, args: dict[str, float]) -> dict[str, Tensor]:
        """The schedule's forward arguments as device tensors (a changing Python number would
        make a compiled model recompile). Each is filled in on the device, not copied from
        the host (a copy waits for the queued work), and reused while its value holds."""
        for key, value in args.items():
            held = self._arg_tensors.get(key)
            if held is None or held[0] != value:
                full = torch.full((), value, dtype=torch.float64, device=self.rt.device)
                self._arg_tensors[key] = (value, full)
        return {key: self._arg_tensors[key][1] for key in args}

    def _target_reached(self, p: Progress) -> bool:
        target = self.cfg.target_val_loss
        return bool(target) and p.val_loss is not None and p.val_loss <= target

    def _log(self, rec: dict) -> None:
        self.sink.write(rec)
        now = time.monotonic()
        # Every log_every steps, every evaluation, the first step, and at least every
        # QUIET_S seconds: a slow run with a sparse log_every must still show it is alive.
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

    def _checkpoint(self, p: Progress, stop_now: bool) -> None:
        """Save when due, at the end, or on a stop request if anything changed since the last
        save; then stop if asked (`Stopped`)."""
        every, last = self.cfg.checkpoint_every, p.step == self.cfg.steps or self._target_reached(p)
        due = (every and p.step % every == 0) or (last and self.cfg.checkpoint_at_end)
        changed = p.step != self._saved_step
        # A run told to save nothing (train.checkpoint_every=0, checkpoint_at_end=false, as
        # experiment=smoke) saves nothing on a stop either.
        saves = bool(every) or self.cfg.checkpoint_at_end
        saved = False
        if self.checkpoints is not None and changed and saves and (due or stop_now):
            self.checkpoints.save(p)
            self._saved_step, saved = p.step, True
        if stop_now:
            signal_name = (self.stop.requested if self.stop else None) or "a signal on another rank"
            where = self.checkpoints.last if self.checkpoints else None
            raise Stopped(
                signal_name, p.step or None, str(where) if where else None, saved,
                saves_none=not saves,
            )  # fmt: skip
