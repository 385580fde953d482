"""The optimizer's step-dependent values, as pure functions of (step, total steps).

The LR follows warmup → stable → cooldown, as in the speedrun records: an optional linear
warmup, a constant LR for most of the run, then a linear decay over the last fraction of the
steps to a floor. Muon's momentum likewise follows the records: it starts lower (a shorter
memory while the early gradients change quickly) and rises linearly to its final value.

`optim_values` gives both for a step; the run's schedule (trainer/schedule.py) asks for them
once per step, with the model's own step values, and hands them to the optimizer object
(`CombinedOptimizer.set_step`).
"""

from dataclasses import dataclass

from optim.config import COOLDOWN_FORMS, OptimConfig


@dataclass(frozen=True)
class OptimValues:
    """What the optimizer takes for one update."""

    lr_mult: float  # the factor on every group's base LR
    muon_momentum: float  # the momentum of the groups that take the scheduled one


def optim_values(cfg: OptimConfig, step: int, total_steps: int) -> OptimValues:
    """The values for update `step` (0-based) of `total_steps`."""
    s, m = cfg.schedule, cfg.muon
    return OptimValues(
        lr_mult=lr_multiplier(
            step, total_steps, s.warmup_steps, s.cooldown_frac, s.min_lr_frac, s.cooldown_form
        ),
        muon_momentum=muon_momentum(
            step, m.momentum_warmup_steps, m.momentum_warmup_start, m.momentum
        ),
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
