"""The run's schedule: every value that depends on the step, from one object.

The loop asks `Schedule.at(step)` once per training step and hands the optimizer its part
(`CombinedOptimizer.set_step`) and the model its part (the forward's keyword arguments);
evaluation after `step` updates asks `model_args(step)`. Each package declares its own
step-dependent values as pure functions of (step, total steps) beside the settings that drive
them: the optimizer's in optim/schedule.py (LR multiplier, Muon momentum), the model's in
model/forward_schedule.py (the attention window, the MTP weights, the varlen kernel's step),
the data's in `TrainConfig.seq_len_at` (the sequence length by stage) and `data_args` here (the
piece cap and the piece limit by stage, which the loader takes as keyword arguments). What
changes by stage is a row of the one stage table, train.stages, and every one of them reads the
step's row through its one rule (`StageTable.index`). A new one is a function there and its
use; this object and the loop pass it through unchanged. `scripts/sample.py` uses the same
object.

The schedules span the scheduled steps, train.steps − train.extension_steps, and hold their
final values over the extension steps after them (the 2025-11 record's 40 of 2,160).
"""

from dataclasses import dataclass, field

from data.config import DataConfig
from model.config import ModelConfig
from model.forward_schedule import forward_args
from optim.config import OptimConfig
from optim.schedule import OptimValues, optim_values
from stages import StageTable
from trainer.config import TrainConfig


@dataclass(frozen=True)
class StepValues:
    """What one training update takes."""

    optim: OptimValues
    model_args: dict[str, float | tuple[float, ...]]  # keyword arguments of the model's forward
    seq_len: int  # tokens per sequence (train.seq_len_at); 0 when built without `train`
    # The loader's keyword arguments (`Schedule.data_args`); {} unless the stages set them
    data_args: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """The run's step-dependent values. `train` gives the extension steps and the stage table
    (train.stages), which the schedule hands each package's values; without it (tools that
    want only the optimizer's values) every step is scheduled, there are no stages and
    StepValues.seq_len is 0. `data` gives the loader's arguments; without it
    StepValues.data_args is {}."""

    total_steps: int
    optim: OptimConfig
    model: ModelConfig
    train: TrainConfig | None = None
    data: DataConfig | None = None

    def __post_init__(self) -> None:
        if self.train is not None and self.train.steps != self.total_steps:
            raise ValueError(
                f"total_steps ({self.total_steps}) must be train.steps ({self.train.steps})"
            )

    @classmethod
    def for_run(
        cls,
        train: TrainConfig,
        optim: OptimConfig,
        model: ModelConfig,
        data: DataConfig | None = None,
    ) -> "Schedule":
        """The schedule of a run with these settings (what the trainer builds)."""
        return cls(train.steps, optim, model, train, data)

    @property
    def scheduled_steps(self) -> int:
        """The steps the schedules span (all but train.extension_steps)."""
        return self.total_steps if self.train is None else self.train.scheduled_steps

    @property
    def stages(self) -> StageTable:
        """The run's stage table: train.stages (none without `train`)."""
        return self.train.stages if self.train is not None else StageTable()

    def at(self, step: int) -> StepValues:
        """The values for update `step` (0-based)."""
        return StepValues(
            optim_values(self.optim, step, self.total_steps, self.scheduled_steps, self.stages),
            self.model_args(step),
            0 if self.train is None else self.train.seq_len_at(step),
            self.data_args(step),
        )

    def data_args(self, step: int) -> dict[str, int]:
        """The loader's keyword arguments at update `step`: {"max_piece_len": its stage's
        cap, "max_pieces": its stage's limit}, each where the stage table sets it; {} without
        `data` or either."""
        if self.data is None or not self.stages.rows:
            return {}
        row = self.stages.row(step, self.scheduled_steps)
        caps = {"max_piece_len": row.max_piece_len, "max_pieces": row.max_pieces}
        return {key: value for key, value in caps.items() if value}

    def model_args(self, step: int) -> dict[str, float | tuple[float, ...]]:
        """The model's forward arguments at `step` (0 ... total_steps: an update, or an
        evaluation after `step` updates; step == total_steps is the final evaluation)."""
        return forward_args(
            self.model, self.stages, step, self.total_steps, self.scheduled_steps,
            final_eval=step == self.total_steps,
        )  # fmt: skip
