"""The attention window's schedules: by phase (the 2025-11 record) and linear (the 2025-01).

By phase: the scheduled steps split into P equal phases (`phase_index`), each with its long
window in blocks (model.attention.window_phases), then model.attention.window_after over the
extension steps and model.attention.window_final_eval for the final evaluation only; the short
window is ⌊long/2⌋ and the YaRN stage is the index of the long window (`window_schedule_at`).
Linear: the long window grows with the step to model.attention.window_tokens (`window_at`).
`ModelConfig.step_args` turns either into the forward's arguments; the sequence length by
phase (train.seq_len_phases) uses the same phases.
"""

from collections.abc import Sequence
from typing import Protocol


class WindowSettings(Protocol):
    """The `model.attention` keys the window schedule reads (an `AttentionConfig`)."""

    window: str
    window_tokens: int
    window_phases: list[int]
    window_after: int
    window_final_eval: int


def phase_index(step: int, scheduled_steps: int, phases: Sequence[object]) -> int:
    """Which of P = len(phases) equal phases of the scheduled steps `step` is in:
    min(⌊P·step / scheduled_steps⌋, P − 1), in integers (exact; the extension steps are in
    the last). The 2025-11 record (P = 3, 2,120 scheduled): 0 up to 706, 1 for 707 ... 1413,
    2 from 1414 on."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    n = len(phases)
    return min(n * step // scheduled_steps, n - 1)


def phase_start(index: int, scheduled_steps: int, n_phases: int) -> int:
    """The first step of phase `index` of `n_phases` (`phase_index`): ⌈index · S / P⌉."""
    return -(-index * scheduled_steps // n_phases)


def window_schedule_at(
    cfg: WindowSettings, step: int, scheduled_steps: int, final_eval: bool = False
) -> tuple[int, int, int]:
    """(long, short, stage) at `step` with model.attention.window_phases: the long window in
    blocks (its phase's, window_after from the end of the scheduled steps on), the short one
    ⌊long/2⌋ and the index of the long window in `cfg.long_windows` (the YaRN stage: the number of
    changes so far where every entry differs from the one before, as in the record; an entry
    equal to the one before makes a stage whose YaRN factors are exactly 1). The final
    evaluation takes window_final_eval as its long window, keeping the short one and the
    stage: the record's switch to 20 blocks is no YaRN step."""
    if step >= scheduled_steps and cfg.window_after:
        long, stage = cfg.window_after, len(cfg.window_phases)
    else:
        stage = phase_index(step, scheduled_steps, cfg.window_phases)
        long = cfg.window_phases[stage]
    short = long // 2
    if final_eval and cfg.window_final_eval:
        long = cfg.window_final_eval
    return long, short, stage


def window_at(step: int, total_steps: int, final: int) -> float:
    """The attention window for `step` (0 ... total_steps, so evaluation after the last update
    has one too): max(final · step / total_steps, 1) tokens. The model rounds it up to whole
    blocks, which for the 2025-01 record (final 1728, blocks of 128, 1770 steps) is
    N(s) = max(1, ⌈9s/1180⌉): 1 block at step 0, 2 from step 132, ..., 14 at step 1770."""
    if not 0 <= step <= total_steps:
        raise ValueError(f"step must be in [0, {total_steps}], got {step}")
    return max(final * step / total_steps, 1.0)


def validate_window_schedule(cfg: WindowSettings) -> None:
    """Raise ValueError naming the window key that is wrong (model.attention.window_phases
    set)."""
    phases = list(cfg.window_phases)
    if cfg.window_tokens:
        raise ValueError(
            "model.attention.window_tokens (a window growing linearly) and "
            "model.attention.window_phases (a window by phase) exclude each other: set one, "
            "the other 0 / []"
        )
    if not cfg.window:
        raise ValueError(
            "model.attention.window_phases needs model.attention.window (which layers have the "
            "long window and which the short one)"
        )
    if not all(isinstance(n, int) and n >= 1 for n in phases):
        raise ValueError(f"model.attention.window_phases must be whole blocks >= 1, got {phases}")
    for key in ("window_after", "window_final_eval"):
        if getattr(cfg, key) < 0:
            raise ValueError(f"model.attention.{key} must be >= 0 blocks, got {getattr(cfg, key)}")
