"""Where a run is and what it has cost so far: the loop's own state, saved in checkpoints."""

import uuid
from dataclasses import dataclass, field


@dataclass
class Progress:
    step: int = 0  # optimizer steps done
    tokens: int = 0  # training tokens consumed
    train_time_s: float = 0.0  # time in training steps (evaluation and saving excluded)
    untimed_s: float = 0.0  # time in the steps train.untimed_steps leaves out of train_time_s
    val_loss: float | None = None  # the latest validation loss
    # The step val_loss was measured after; None in a save from before it was kept. A stop
    # that cuts the final evaluation short leaves an older loss: the resume measures it again.
    val_step: int | None = None
    skipped_steps: int = 0  # steps whose update was dropped (train.on_nonfinite=skip)
    # The run's identity across resumes (the wandb run id): rank 0's, made at step 0.
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])

    def advance(self, tokens: int, seconds: float, timed: bool) -> None:
        """One more optimizer step, of `tokens` tokens in `seconds` (counted in the train time
        when `timed`: the records time from train.untimed_steps on)."""
        self.step, self.tokens = self.step + 1, self.tokens + tokens
        if timed:
            self.train_time_s += seconds
        else:
            self.untimed_s += seconds

    def reached(self, target: float) -> bool:
        """Whether the latest validation loss reached `target` (train.target_val_loss; 0: none)."""
        return bool(target) and self.val_loss is not None and self.val_loss <= target
