"""The optimizer's step-dependent values, as pure functions of (step, total steps).

The LR follows warmup → stable → cooldown, as in the speedrun records: an optional linear
warmup, a constant LR for most of the run, then a linear decay over the last fraction of the
steps to a floor. Muon's momentum likewise follows the records: it starts lower (a shorter
memory while the early gradients change quickly) and rises linearly to its final value; it
may fall again over the last steps (the 2025-11 record).

The 2025-11 record adds two things: extension steps after the schedule's end (its span is the
scheduled steps, train.steps − train.extension_steps; after it the LR holds its floor), and a
plateau ("peak") per stage that the cooldown falls from (`peak_lr_multiplier`), the stage table's
lr_peak column (train.stages, stages/table.py), switched at fractions of the steps of its own (the
table's peak_edges, `lr_peak_at`). record_2026_07_17 (2026-07) switches its peaks with the stages,
by the table's one rule, and draws the cooldown from a whole step (cooldown_form=from_step).

`optim_values` gives both for a step; the run's schedule (trainer/schedule.py) asks for them
once per step, with the model's own step values, and hands them to the optimizer object
(`CombinedOptimizer.set_step`).
"""

from collections.abc import Sequence
from dataclasses import dataclass

from optim.config import COOLDOWN_FORMS, OptimConfig
from stages import StageTable


@dataclass(frozen=True)
class OptimValues:
    """What the optimizer takes for one update."""

    lr_mult: float  # the factor on every group's base LR
    muon_momentum: float  # the momentum of the groups that take the scheduled one


def optim_values(
    cfg: OptimConfig,
    step: int,
    total_steps: int,
    scheduled_steps: int | None = None,
    stages: StageTable | None = None,
) -> OptimValues:
    """The values for update `step` (0-based) of `total_steps`; the LR schedule spans the
    first `scheduled_steps` (default all) and holds its floor after them. `stages`: the run's
    stage table, whose lr_peak column gives the plateaus (`lr_peak_at`)."""
    s, m = cfg.schedule, cfg.muon
    scheduled = total_steps if scheduled_steps is None else scheduled_steps
    if not 0 < scheduled <= total_steps:
        raise ValueError(f"scheduled_steps must be in [1, {total_steps}], got {scheduled}")
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, {total_steps}), got {step}")
    if step >= scheduled:  # an extension step: past the schedule's end, at its floor
        lr = s.min_lr_frac
    elif stages is not None and stages.column("lr_peak"):
        peak = lr_peak_at(stages, step, scheduled)
        lr = peak_lr_multiplier(
            step, scheduled, peak, s.warmup_steps, s.cooldown_frac, s.min_lr_frac, s.cooldown_form
        )
    else:
        lr = lr_multiplier(
            step, scheduled, s.warmup_steps, s.cooldown_frac, s.min_lr_frac, s.cooldown_form
        )
    momentum = muon_momentum(step, m.momentum_warmup_steps, m.momentum_warmup_start, m.momentum)
    # Where warmup and cooldown overlap (a run shorter than both), the warmup wins, as in the
    # records' code (an if / elif): the cooldown starts after the warmup's last step.
    if m.momentum_cooldown_steps and step >= m.momentum_warmup_steps:
        momentum = momentum_cooldown(
            step, total_steps, m.momentum_cooldown_steps, momentum, m.momentum_cooldown_end
        )
    return OptimValues(lr_mult=lr, muon_momentum=momentum)


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

    cooldown_form="fraction" draws the cooldown in the fraction of training left instead, as the
    2025-01 record does: t = 1 − step/total_steps, w = min(t / cooldown_frac, 1), factor w·1 + (1 −
    w)·min_lr_frac, the same operations in the same order as its script, so that the factors are its
    bits. The steps form equals it up to rounding where cooldown_frac · total_steps is whole;
    elsewhere its line starts at the rounded step. cooldown_form="from_step" is record_2026_07_17's
    (`from_step_cooldown` with peak 1). Warmup applies first in all.
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
    if cooldown_form == "from_step":
        return from_step_cooldown(step, total_steps, 1.0, cooldown_frac, min_lr_frac)
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


def from_step_cooldown(
    step: int, scheduled_steps: int, peak: float, cooldown_frac: float, min_lr_frac: float
) -> float:
    """record_2026_07_17's cooldown at `step` of S = `scheduled_steps` (< S): `peak` before the
    whole step c = ⌊S·(1 − cooldown_frac)⌋, then τ = min(1, (step − c)/(S − c)) and f = peak·(1 − τ)
    + min_lr_frac·τ, the record's operations in its order (its bits; for 1,380 steps and 0.6: c =
    552, τ = (s − 552)/828)."""
    start = int(scheduled_steps * (1 - cooldown_frac))
    if step < start:
        return peak
    tau = min(1.0, (step - start) / (scheduled_steps - start))
    return peak * (1 - tau) + min_lr_frac * tau


def peak_index(step: int, scheduled_steps: int, edges: Sequence[float]) -> int:
    """Which plateau `step` is on where the plateaus have edges of their own: the number of edges
    below x = step / scheduled_steps (x > edge: record_2025_11_29's peak steps up at s = 700 and
    1400 of 2120 for edges 0.33, 0.66, before its batch does at 707 and 1414)."""
    x = step / scheduled_steps
    return sum(x > edge for edge in edges)


def lr_peak_at(stages: StageTable, step: int, scheduled_steps: int) -> float:
    """The plateau at `step`: the lr_peak of row `peak_index` where the table has peak_edges
    (record_2025_11_29), else of the step's own stage (`StageTable.index`, the rule every stage
    column follows: record_2026_07_17's peaks switch with its batch at exactly 460 and 920 of
    1,380)."""
    if stages.peak_edges:
        return stages.rows[peak_index(step, scheduled_steps, stages.peak_edges)].lr_peak
    return stages.row(step, scheduled_steps).lr_peak


def peak_lr_multiplier(
    step: int,
    scheduled_steps: int,
    peak: float,
    warmup_steps: int,
    cooldown_frac: float,
    min_lr_frac: float,
    cooldown_form: str = "fraction",
) -> float:
    """The 2025-11 record's LR multiplier at `step` of S = `scheduled_steps` on the plateau
    p = `peak` (`lr_peak_at`): p, and from x = step / S >= 1 − cooldown_frac on the line from
    p down to the floor at S,

        f = min_lr_frac + (p − min_lr_frac) · (S − step) / (cooldown_frac · S),

    evaluated in that order, left to right (the spec's 0.1 + (p − 0.1)·(2120 − s)/1166, with 1166 =
    0.55 · 2120 computed as the product). The line restarts from the new p where the plateau steps
    up inside the cooldown (the record's jump 0.972 → 1.230 at s = 1400). Steps from S on run at the
    floor. Warmup, when asked for, applies first, (step + 1) / warmup_steps, as in `lr_multiplier`.
    cooldown_form="from_step": record_2026_07_17's line from the current peak instead
    (`from_step_cooldown`), with the same jump where the peak steps up inside the cooldown (0.913 →
    1.028 at s = 920).
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if step >= scheduled_steps:
        return min_lr_frac
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if cooldown_form == "from_step":
        return from_step_cooldown(step, scheduled_steps, peak, cooldown_frac, min_lr_frac)
    if step / scheduled_steps < 1 - cooldown_frac:
        return peak
    return min_lr_frac + (peak - min_lr_frac) * (scheduled_steps - step) / (
        cooldown_frac * scheduled_steps
    )


def momentum_cooldown(
    step: int, total_steps: int, cooldown_steps: int, momentum: float, end: float
) -> float:
    """Muon's momentum over the last K = `cooldown_steps` steps: from `momentum` at step
    total_steps − K, linear towards `end` at total_steps,
    μ = momentum − (momentum − end) · (step − (total_steps − K)) / K (the 2025-11 record:
    0.95 − 0.1·(s − 2110)/50, so 0.948 at 2111 and 0.852 at the last step 2159). Earlier
    steps keep `momentum` as given; `optim_values` calls it only after the warmup."""
    start = total_steps - cooldown_steps
    if cooldown_steps <= 0 or step <= start:
        return momentum
    return momentum - (momentum - end) * (step - start) / cooldown_steps
