"""The attention window's schedules: by stage (the 2025-11 and later records) and linear (the
2025-01 record's).

By stage: each row of the stage table (train.stages, stages/table.py) gives the long window
in blocks, the table's window_after the extension steps' and window_final_eval the final
evaluation's; the short window is ⌊long/2⌋ and the YaRN stage is the index of the long window
(`window_schedule_at`). Linear: the long window grows with the step to
model.attention.window_tokens (`window_at`). `forward_args` (model/forward_schedule.py) turns
either into the forward's arguments.
"""

from stages import StageTable


def window_schedule_at(
    stages: StageTable, step: int, scheduled_steps: int, final_eval: bool = False
) -> tuple[int, int, int]:
    """(long, short, stage) at `step`: the long window in blocks (its stage's row, window_after
    from the end of the scheduled steps on), the short one ⌊long/2⌋ and the index of the long
    window in `stages.long_windows` (the YaRN stage: the row's index, len(rows) over the
    extension steps; a window equal to the one before makes a stage whose YaRN factors are
    exactly 1). The final evaluation takes window_final_eval as its long window, keeping the
    short one and the stage: the records' switch to 20 blocks is no YaRN step."""
    if step >= scheduled_steps and stages.window_after:
        long, stage = stages.window_after, len(stages.rows)
    else:
        stage = stages.index(step, scheduled_steps)
        long = stages.rows[stage].window
    short = long // 2
    if final_eval and stages.window_final_eval:
        long = stages.window_final_eval
    return long, short, stage


def window_at(step: int, total_steps: int, final: int) -> float:
    """The attention window for `step` (0 ... total_steps, so evaluation after the last update
    has one too): max(final · step / total_steps, 1) tokens. The model rounds it up to whole
    blocks, which for the 2025-01 record (final 1728, blocks of 128, 1770 steps) is
    N(s) = max(1, ⌈9s/1180⌉): 1 block at step 0, 2 from step 132, ..., 14 at step 1770."""
    if not 0 <= step <= total_steps:
        raise ValueError(f"step must be in [0, {total_steps}], got {step}")
    return max(final * step / total_steps, 1.0)
