"""When a run saves: every `train.checkpoint_every` steps, at the end (the last step, or the
target reached) under `train.checkpoint_at_end`, and on a stop request; never twice for one
step."""

from trainer.config import TrainConfig
from trainer.observe.progress import Progress


def saves_any(t: TrainConfig) -> bool:
    """Whether the run saves at all: one told to save nothing (train.checkpoint_every=0,
    checkpoint_at_end=false, as experiment=smoke) saves nothing on a stop either."""
    return bool(t.checkpoint_every) or t.checkpoint_at_end


def save_due(t: TrainConfig, p: Progress, saved_step: int, stop_now: bool) -> bool:
    """Whether to save at `p` (the newest save is of `saved_step`): when due, at the end, or on
    a stop request, if anything changed since the last save."""
    every, last = t.checkpoint_every, p.step == t.steps or p.reached(t.target_val_loss)
    due = (every and p.step % every == 0) or (last and t.checkpoint_at_end)
    changed = p.step != saved_step
    return bool(changed and saves_any(t) and (due or stop_now))
