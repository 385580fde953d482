"""The run's schedule: every value that depends on the step, from one object.

The loop asks `Schedule.at(step)` once per training step and hands the optimizer its part
(`CombinedOptimizer.set_step`) and the model its part (the forward's keyword arguments);
evaluation after `step` updates asks `model_args(step)`. Each package declares its own
step-dependent values as pure functions of (step, total steps) beside the settings that drive
them: the optimizer's in optim/schedule.py (LR multiplier, Muon momentum), the model's in
`ModelConfig.step_args` (the attention window, the MTP weights), the data's in
`TrainConfig.seq_len_at` (the sequence length by phase) and `data_args` here (the piece cap
and the piece limit by phase, data.max_piece_len_phases / data.max_pieces, which the loader
takes as keyword arguments). A new one is a function there and its use; this object and the
loop pass it through unchanged. `scripts/sample.py` uses the same object.

The schedules span the scheduled steps, train.steps − train.extension_steps, and hold their
final values over the extension steps after them (the 2025-11 record's 40 of 2,160).
"""

from dataclasses import dataclass, field

from data.config import DataConfig
from model.config import ModelConfig
from model.window_schedule import phase_index
from optim.config import OptimConfig
from optim.schedule import OptimValues, optim_values
from trainer.config import TrainConfig


@dataclass(frozen=True)
class StepValues:
    """What one training update takes."""

    optim: OptimValues
    model_args: dict[str, float | tuple[float, ...]]  # keyword arguments of the model's forward
    seq_len: int  # tokens per sequence (train.seq_len_at); 0 when built without `train`
    # The loader's keyword arguments (`Schedule.data_args`); {} unless data phases are set
    data_args: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Schedule:
    """The run's step-dependent values. `train` gives the extension steps and the sequence
    length by phase; without it (tools that want only the optimizer's or the model's values)
    every step is scheduled and StepValues.seq_len is 0. `data` gives the piece cap and
    limit by phase; without it StepValues.data_args is {}."""

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

    def at(self, step: int) -> StepValues:
        """The values for update `step` (0-based)."""
        return StepValues(
            optim_values(self.optim, step, self.total_steps, self.scheduled_steps),
            self.model_args(step),
            0 if self.train is None else self.train.seq_len_at(step),
            self.data_args(step),
        )

    def data_args(self, step: int) -> dict[str, int]:
        """The loader's keyword arguments at update `step`: {"max_piece_len": its phase's
        cap} with data.max_piece_len_phases, {"max_pieces": its phase's limit} with
        data.max_pieces (the phases of `phase_index`, as the batch's); {} without either."""
        args: dict[str, int] = {}
        if self.data is None:
            return args
        for key, phases in (
            ("max_piece_len", self.data.max_piece_len_phases),
            ("max_pieces", self.data.max_pieces),
        ):
            if phases:
                args[key] = phases[phase_index(step, self.scheduled_steps, phases)]
        return args

    def model_args(self, step: int) -> dict[str, float | tuple[float, ...]]:
        """The model's forward arguments at `step` (0 ... total_steps: an update, or an
        evaluation after `step` updates; step == total_steps is the final evaluation)."""
        return self.model.step_args(
            step, self.total_steps, self.scheduled_steps, final_eval=step == self.total_steps
        )
