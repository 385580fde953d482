"""Learning-rate and Muon-momentum schedules, as pure functions of the step.

The LR follows warmup → stable → cooldown, as in the speedrun records: an optional linear
warmup, a constant LR for most of the run, then a linear decay over the last fraction of the
steps. Muon's momentum likewise follows the records: it starts lower (a shorter memory while
the early gradients change quickly) and rises linearly to its final value.
"""


def lr_multiplier(
    step: int, total_steps: int, warmup_steps: int, cooldown_frac: float, min_lr_frac: float
) -> float:
    """The factor on every group's LR at `step` (0-based, of `total_steps`).

    Warmup: (step + 1) / warmup_steps for the first `warmup_steps` steps, so the first step
    already moves the weights and the last warmup step runs at the full LR. Cooldown: over the
    last C = round(cooldown_frac · total_steps) steps it falls linearly, (steps left) / C of
    the way from `min_lr_frac` to 1, so the final step runs at min_lr_frac + (1 - min_lr_frac)/C
    and the floor is where the line ends, after it: with a floor of 0 no step is wasted at
    LR 0. In between it is 1.
    """
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, {total_steps}), got {step}")
    cooldown_steps = round(cooldown_frac * total_steps)
    if warmup_steps + cooldown_steps > total_steps:
        raise ValueError(
            f"warmup ({warmup_steps}) + cooldown ({cooldown_steps}) steps exceed {total_steps}"
        )
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    steps_left = total_steps - step  # 1 at the final step
    if steps_left < cooldown_steps:
        return min_lr_frac + steps_left / cooldown_steps * (1.0 - min_lr_frac)
    return 1.0


def muon_momentum(step: int, warmup_steps: int, start: float, end: float) -> float:
    """Muon's momentum: `start` at step 0, linear to `end` at `warmup_steps`, then `end`."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return end
    frac = step / warmup_steps
    return start + frac * (end - start)
