"""The run's schedule: every value that depends on the step, from one object.

The loop asks `Schedule.at(step)` once per training step and hands the optimizer its part
(`CombinedOptimizer.set_step`) and the model its part (the forward's keyword arguments);
evaluation after `step` updates asks `model_args(step)`. Each package declares its own
step-dependent values as pure functions of (step, total steps) beside the settings that drive
them: the optimizer's in optim/schedule.py (LR multiplier, Muon momentum), the model's in
`ModelConfig.step_args` (the attention window). A new one is a function there and its use;
this object and the loop pass it through unchanged. `scripts/sample.py` uses the same object.
"""

from dataclasses import dataclass

from model.config import ModelConfig
from optim.config import OptimConfig
from optim.schedule import OptimValues, optim_values


@dataclass(frozen=True)
class StepValues:
    """What one training update takes."""

    optim: OptimValues
    model_args: dict[str, float]  # keyword arguments of the model's forward


@dataclass(frozen=True)
class Schedule:
    total_steps: int
    optim: OptimConfig
    model: ModelConfig

    def at(self, step: int) -> StepValues:
        """The values for update `step` (0-based)."""
        return StepValues(optim_values(self.optim, step, self.total_steps), self.model_args(step))

    def model_args(self, step: int) -> dict[str, float]:
        """The model's forward arguments at `step` (0 ... total_steps: an update, or an
        evaluation after `step` updates)."""
        return self.model.step_args(step, self.total_steps)
