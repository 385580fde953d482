"""The training loop: step, evaluate on a fixed token budget, log, checkpoint.

Train time is wall-clock time spent in training steps only; evaluation and checkpointing are
excluded, the way public speedrun records are timed. Losses are reduced over all ranks, so the
logged curve is the same whatever the number of ranks or micro-steps that computed it.
"""

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from data.loader import Batch
from trainer.checkpoint.checkpointer import Checkpointer
from trainer.checkpoint.when import save_due, saves_any
from trainer.config import TrainConfig
from trainer.forward import evaluate
from trainer.launch.signals import Stopped, StopRequests
from trainer.nonfinite import on_nonfinite
from trainer.observe.console import StepLog, format_step, run_summary
from trainer.observe.metrics import (
    EvalProgress,
    MetricsSink,
    seconds_per_token,
    step_rates,
    step_record,
)
from trainer.observe.progress import Progress
from trainer.reference import Curve, target_eta_s
from trainer.train_step import TrainStep


@dataclass
class Loop:
    """Everything a run steps through; `run()` is the loop, in these steps:

    1. `_begin` (at step 0): the first evaluation and the first record, with the code's version;
    2. until `train.steps` or the target: a stop request acted on before the step (one
       process), `_train_step` (the step, trainer/train_step.py, and its record), `_evaluate` when
       due (and the target check), the record and its console line (`StepLog`), then
       `_checkpoint`: a save when due (checkpoint/when.py), and `Stopped` when asked;
    3. `_finish`: the validation loss a resumed save lacked, and the summary line.
    """

    stepper: TrainStep  # one optimizer step: schedule, batch, forward/backward, update
    val_batches: Callable[[], Iterable[Batch]]  # the same validation batches every call
    cfg: TrainConfig
    sink: MetricsSink
    checkpoints: Checkpointer | None = None
    stop: StopRequests | None = None
    peak_flops: float | None = None  # one GPU's bf16 peak; None: no MFU (CPU, unknown GPU)
    code: dict | None = None  # the code's commit and dirty flag, in the first metrics line
    # The training data's pass (0 = the first) after each step: its record's `epoch`
    data_epoch: Callable[[], int] | None = None
    reference: Curve | None = None  # train.reference.curve: the time to its target, estimated
    _saved_step: int = field(default=0, init=False, repr=False)  # the newest checkpoint's step
    _log: StepLog = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._log = StepLog(self.sink, self.cfg)

    def run(self, start: Progress | None = None) -> float:
        """Train from `start` (default: step 0) to `train.steps`; return the final val loss.

        Raises `Stopped` after saving a checkpoint when a SIGTERM/SIGINT asked to stop, and
        `NonFiniteStep` on a NaN/inf loss or gradient under train.on_nonfinite=stop.
        """
        p = start or Progress()
        self._saved_step = p.step  # a fresh start has nothing to save, a resume saved this
        if p.step == 0:
            self._begin(p)
        elif p.val_step != p.step and p.step < self.cfg.steps and self._val_due(p.step):
            self._complete(p)  # a stop cut this step's evaluation short: measure it now
        self.stepper.model.train()
        while p.step < self.cfg.steps and not p.reached(self.cfg.target_val_loss):
            # One process acts on a stop request before the step; several agree in its reduction
            if self.stepper.rt.world_size == 1 and self.stop is not None and self.stop.requested:
                self._checkpoint(p, True)
            rec, stop_now = self._train_step(p)
            if p.step == self.cfg.steps or self._val_due(p.step):
                stop_now = not self._evaluate(p, rec) or stop_now
            self._log.write(rec)
            self._checkpoint(p, stop_now)
        return self._finish(p)

    def _begin(self, p: Progress) -> None:
        first = {"step": 0, "tokens": 0, "train_time_ms": 0.0}
        if self.code is not None:
            first["code"] = self.code
        if not self._evaluate(p, first):
            self._checkpoint(p, True)  # stopped before any update: nothing saved
        self._log.write(first)

    def _finish(self, p: Progress) -> float:
        if p.val_step != p.step:  # resumed from a save without its final val loss
            # metrics.jsonl must show the run finished (scripts/report.py counts a run by the
            # validation loss at its last step)
            self._complete(p)
        self.sink.info("%s", run_summary(p, self.cfg.untimed_steps))
        return p.val_loss

    def _val_due(self, step: int) -> bool:
        return bool(self.cfg.val_every) and step % self.cfg.val_every == 0

    def _complete(self, p: Progress) -> None:
        """The evaluation of step `p.step` that its run did not finish (a stop cut it short, or
        the save came before it), added to that step's record: the resumed curve is then the
        curve of a run that never stopped, an evaluation at every step it evaluates at."""
        rec = {"step": p.step, "tokens": p.tokens, "train_time_ms": p.train_time_s * 1000}
        if not self._evaluate(p, rec):
            self._checkpoint(p, True)  # stopped again, inside it
        self.sink.amend(rec)
        self.sink.info(format_step(rec, self.cfg.steps))

    def _train_step(self, p: Progress) -> tuple[dict, bool]:
        """One optimizer step; advances `p` and returns the step's record and whether to stop."""
        step, opt, rt = p.step + 1, self.stepper.optimizer, self.stepper.rt
        self._doing(f"step {step} of {self.cfg.steps}")
        done = self.stepper(step, self._asked)
        self._doing(None)
        tokens = self.cfg.step_tokens(step - 1)
        p.advance(tokens, done.seconds, timed=step > self.cfg.untimed_steps)
        rec = step_record(p, done.loss, done.lr_mult, opt.lrs(), opt.stats, done.seconds, tokens)
        rec.update(step_rates(p, self.cfg, rt, done.seconds, done.flops, self.peak_flops))
        if self.data_epoch is not None:
            rec["epoch"] = self.data_epoch()
        if not done.finite:
            last = self.checkpoints.last if self.checkpoints is not None else None
            on_nonfinite(
                p, rec, done.loss, done.grads_finite, self.cfg.on_nonfinite, last, self.sink
            )
        return rec, done.stop

    def _evaluate(self, p: Progress, rec: dict) -> bool:
        """Validation loss into `p` and `rec`, and whether it reached the target; False when a
        stop request cut the evaluation short (`rec` then has no val loss)."""
        val_loss = self._val_loss(p.step)
        if val_loss is None:
            return False
        p.val_loss = rec["val_loss"] = val_loss
        p.val_step = p.step
        if self.reference is not None:
            rec.update(against_reference(self.reference, p, self.cfg))
        if p.reached(self.cfg.target_val_loss):
            rec["target_reached"] = True
        return True

    def _val_loss(self, step: int) -> float | None:
        """The validation loss after `step` updates, with the schedule's forward arguments
        (None: a stop request cut it short). A long evaluation reports its progress."""
        s = self.stepper
        args = s.on_device(s.schedule.model_args(step))
        report = EvalProgress.for_eval(self.sink, step, self.cfg, s.rt)
        self._doing(f"the validation after step {step}", "it stops at its next batch")
        try:
            stop = None if self.stop is None else self._asked
            return evaluate(s.model, self.val_batches(), s.rt, args, stop, report)
        finally:
            self._doing(None)

    def _asked(self) -> bool:
        return self.stop is not None and self.stop.requested is not None

    def _doing(self, what: str | None, until: str = "the run stops when it ends") -> None:
        """Tell the stop requests what runs now, for a request's announcement."""
        if self.stop is not None:
            self.stop.doing(what, until)

    def _checkpoint(self, p: Progress, stop_now: bool) -> None:
        """Save when due, at the end, or on a stop request if anything changed since the last
        save; then stop if asked (`Stopped`)."""
        saved = False
        if self.checkpoints is not None and save_due(self.cfg, p, self._saved_step, stop_now):
            self.checkpoints.save(p)
            self._saved_step, saved = p.step, True
        if stop_now:
            signal_name = (self.stop.requested if self.stop else None) or "a signal on another rank"
            where = self.checkpoints.last if self.checkpoints else None
            raise Stopped(
                signal_name, p.step or None, str(where) if where else None, saved,
                saves_none=not saves_any(self.cfg),
            )  # fmt: skip


def against_reference(curve: Curve, p: Progress, t: TrainConfig) -> dict[str, float]:
    """The reference curve's loss at this run's tokens, and the time to its target at this
    run's speed (trainer/reference.py), for the evaluation just made."""
    out = {"reference_val_loss": curve.loss_at_tokens(p.tokens)}
    per_token = seconds_per_token(p, t)
    eta = (
        None
        if per_token is None
        else target_eta_s(curve, t.reference.target, p.val_loss, per_token)
    )
    if eta is not None:
        out["target_eta_s"] = eta
    return out
