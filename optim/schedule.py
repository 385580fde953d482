"""Every step-dependent value of a run, as pure functions of (step, total steps).

The LR follows warmup → stable → cooldown, as in the speedrun records: an optional linear
warmup, a constant LR for most of the run, then a linear decay over the last fraction of the
steps to a floor. Muon's momentum likewise follows the records: it starts lower (a shorter
memory while the early gradients change quickly) and rises linearly to its final value.

`Schedules` gathers the settings once, at build time, and `at(step)` gives every value for
that step; the optimizer object applies them (`CombinedOptimizer.schedule`). A new
step-dependent value (an attention window, a batch size, a per-group LR floor) is one more
pure function here, one more field of `StepValues`, and one line in `Schedules.at`: nothing
in the model or the loop computes anything from a step counter.
"""

from dataclasses import dataclass, field

# `optim.schedule.cooldown_form`: how the cooldown line is drawn. steps: over a whole number of
# steps, C = round(cooldown_frac · total_steps), (steps left) / C of the way down (the 2024-11
# record's (3200 − s) / 914) | fraction: continuously in the fraction of training left,
# t = 1 − s/S, w = min(t / cooldown_frac, 1), evaluated as the 2025-01 record writes it.
# The two agree where cooldown_frac · total_steps is a whole number, up to rounding.
COOLDOWN_FORMS = ("steps", "fraction")


@dataclass
class ScheduleConfig:
    """The `optim.schedule` settings: the LR multiplier shared by every parameter group."""

    warmup_steps: int = 0  # linear warmup from 0 to the full LR
    cooldown_frac: float = 0.4  # last fraction of steps: linear decay to min_lr_frac
    min_lr_frac: float = 0.0  # LR floor at the end, as a fraction of each group's LR
    # steps: decay over round(cooldown_frac · steps) whole steps | fraction: over the exact
    # fraction of training, the 2025-01 record's formula (COOLDOWN_FORMS)
    cooldown_form: str = field(default="steps", metadata={"choices": COOLDOWN_FORMS})
    # Sliding attention window at the last step, in tokens (model.window layers): it grows
    # linearly from 1 token (rounded up to whole blocks by the model) | 0 = no window
    window_tokens: int = 0

    def validate(self, total_steps: int) -> None:
        """Raise ValueError naming the `optim.schedule.*` key that is wrong."""
        for key in ("warmup_steps", "window_tokens"):
            if getattr(self, key) < 0:
                raise ValueError(f"optim.schedule.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("cooldown_frac", "min_lr_frac"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(
                    f"optim.schedule.{key} must be in [0, 1], got {getattr(self, key)}"
                )
        if self.cooldown_form not in COOLDOWN_FORMS:
            raise ValueError(
                f"optim.schedule.cooldown_form must be one of {list(COOLDOWN_FORMS)}, "
                f"got {self.cooldown_form!r}"
            )
        cooldown = cooldown_steps(self.cooldown_frac, total_steps)
        if self.warmup_steps + cooldown > total_steps:
            raise ValueError(
                f"optim.schedule.warmup_steps ({self.warmup_steps}) + cooldown "
                f"({cooldown} = cooldown_frac * train.steps) exceed train.steps ({total_steps})"
            )


def cooldown_steps(cooldown_frac: float, total_steps: int) -> int:
    """The number of steps the cooldown spans: round(cooldown_frac · total_steps)."""
    return round(cooldown_frac * total_steps)


def lr_multiplier(
    step: int,
    total_steps: int,
    warmup_steps: int,
    cooldown_frac: float,
    min_lr_frac: float,
    cooldown_form: str = "steps",
) -> float:
    """The factor on every group's LR at `step` (0-based, of `total_steps`).

    Warmup: (step + 1) / warmup_steps for the first `warmup_steps` steps, so the first step
    already moves the weights and the last warmup step runs at the full LR. Cooldown: over the
    last C = round(cooldown_frac · total_steps) steps it falls linearly, (steps left) / C of
    the way from `min_lr_frac` to 1, so the final step runs at min_lr_frac + (1 - min_lr_frac)/C
    and the floor is where the line ends, after it: with a floor of 0 no step is wasted at
    LR 0. In between it is 1.

    cooldown_form="fraction" draws the cooldown in the fraction of training left instead, as
    the 2025-01 record does: t = 1 − step/total_steps, w = min(t / cooldown_frac, 1), factor
    w·1 + (1 − w)·min_lr_frac, the same operations in the same order as its script, so that
    the factors are its bits. The steps form equals it up to rounding where
    cooldown_frac · total_steps is whole; elsewhere its line starts at the rounded step.
    Warmup applies first in both.
    """
    if cooldown_form not in COOLDOWN_FORMS:
        raise ValueError(
            f"cooldown_form must be one of {list(COOLDOWN_FORMS)}, got {cooldown_form!r}"
        )
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, {total_steps}), got {step}")
    cooldown = cooldown_steps(cooldown_frac, total_steps)
    if warmup_steps + cooldown > total_steps:
        raise ValueError(
            f"warmup ({warmup_steps}) + cooldown ({cooldown}) steps exceed {total_steps}"
        )
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if cooldown_form == "fraction":
        if cooldown_frac == 0:
            return 1.0  # no cooldown (t / 0 would be +inf, and w = 1)
        t = 1 - step / total_steps
        w = min(t / cooldown_frac, 1.0)
        return w * 1.0 + (1 - w) * min_lr_frac
    steps_left = total_steps - step  # 1 at the final step
    if steps_left < cooldown:
        return min_lr_frac + steps_left / cooldown * (1.0 - min_lr_frac)
    return 1.0


def muon_momentum(step: int, warmup_steps: int, start: float, end: float) -> float:
    """Muon's momentum: `start` at step 0, linear to `end` at `warmup_steps`, then `end`."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return end
    frac = step / warmup_steps
    return start + frac * (end - start)


def window_tokens(step: int, total_steps: int, final: int) -> float:
    """The attention window for `step` (0 ... total_steps, so evaluation after the last update
    has one too): max(final · step / total_steps, 1) tokens. The model rounds it up to whole
    blocks, which for the 2025-01 record (final 1728, blocks of 128, 1770 steps) is
    N(s) = max(1, ⌈9s/1180⌉): 1 block at step 0, 2 from step 132, ..., 14 at step 1770."""
    if not 0 <= step <= total_steps:
        raise ValueError(f"step must be in [0, {total_steps}], got {step}")
    return max(final * step / total_steps, 1.0)


@dataclass(frozen=True)
class StepValues:
    """What the schedules give one step (for update `step`, 0-based)."""

    lr_mult: float  # the factor on every group's base LR
    muon_momentum: float  # Muon's momentum
    window_tokens: float | None = None  # the attention window (None: no window schedule)


@dataclass(frozen=True)
class Schedules:
    """The settings of every schedule of one run, fixed at build time."""

    total_steps: int
    lr: ScheduleConfig
    momentum_warmup_steps: int = 0
    momentum_start: float = 0.0
    momentum: float = 0.0

    def at(self, step: int) -> StepValues:
        s = self.lr
        return StepValues(
            lr_mult=lr_multiplier(
                step,
                self.total_steps,
                s.warmup_steps,
                s.cooldown_frac,
                s.min_lr_frac,
                s.cooldown_form,
            ),
            muon_momentum=muon_momentum(
                step, self.momentum_warmup_steps, self.momentum_start, self.momentum
            ),
            window_tokens=self.model_args(step).get("window_tokens"),
        )

    def model_args(self, step: int) -> dict[str, float]:
        """The step-dependent arguments of the model's forward at `step` (0 ... total_steps:
        the training update `step`, or an evaluation after `step` updates)."""
        if not self.lr.window_tokens:
            return {}
        return {"window_tokens": window_tokens(step, self.total_steps, self.lr.window_tokens)}
