"""The forward's step-dependent arguments: the model's part of the run's schedule.

The run's schedule (trainer/schedule.py) holds the stage table (train.stages) and asks
`forward_args` once per step; the model is handed the table once, when it is built
(`GPT(cfg, stages)`: the YaRN tables follow its long windows, `yarn_windows`). The model's
config is settings only: it carries no table. Free of torch, in the config layer, beside the
window and MTP-weight schedules it composes (model/window_schedule.py, model/mtp_schedule.py).

`check_stages` is the model's check of the table against its settings (a window by stage
needs the layers' window pattern, YaRN needs a window by stage), which the root config runs
with the others across groups.
"""

import math

from model.config import ModelConfig
from model.config.kernel_step import KernelStep
from model.mtp_schedule import mtp_weights_at
from model.window_schedule import window_at, window_schedule_at
from stages import StageTable

Args = dict[str, float | tuple[float, ...] | KernelStep]


def forward_args(
    cfg: ModelConfig,
    stages: StageTable | None,
    step: int,
    total_steps: int,
    scheduled_steps: int | None = None,
    final_eval: bool = False,
) -> Args:
    """The forward's step-dependent arguments for `step` (0 ... total_steps: the training
    update `step`, or an evaluation after `step` updates) under the stage table `stages`. The
    schedules span the first `scheduled_steps` (default all) and hold their final values
    after; `final_eval`: the evaluation after the last update (the table's window_final_eval).

    With a window by stage (the table's window column): {"window_tokens": the long window,
    "short_window_tokens": the short one (both whole blocks, in tokens), and with yarn
    "yarn_stage": the index into `yarn_windows` (`window_schedule_at`)}. Otherwise
    {"window_tokens": window_at(...)} with attention.window_tokens, or {}. With head.mtp and
    the table's mtp_weights also "mtp_weights": the multi-token weights, a tuple of the
    longest row's length (`mtp_weights_at`). With attention.impl=varlen also "kernel_step"."""
    stages = stages or StageTable()
    scheduled = total_steps if scheduled_steps is None else scheduled_steps
    args: Args = dict(window_args(cfg, stages, step, total_steps, scheduled, final_eval))
    if cfg.head.mtp and stages.column("mtp_weights"):
        args["mtp_weights"] = mtp_weights_at(stages, step, scheduled)
    if cfg.attention.impl == "varlen":
        args["kernel_step"] = kernel_step(cfg, stages, args, step, scheduled)
    return args


def window_args(
    cfg: ModelConfig, stages: StageTable, step: int, total_steps: int, scheduled: int,
    final_eval: bool,
) -> dict[str, float]:  # fmt: skip
    """`forward_args`' window part."""
    att = cfg.attention
    if stages.column("window"):
        long, short, stage = window_schedule_at(stages, step, scheduled, final_eval)
        args = {
            "window_tokens": long * att.window_block,
            "short_window_tokens": short * att.window_block,
        }
        return {**args, "yarn_stage": stage} if att.yarn else args
    if not att.window_tokens:
        return {}
    if scheduled == total_steps:
        return {"window_tokens": window_at(step, total_steps, att.window_tokens)}
    # Extension steps keep the final window: the growth spans the scheduled steps.
    return {"window_tokens": window_at(min(step, scheduled), scheduled, att.window_tokens)}


def kernel_step(
    cfg: ModelConfig, stages: StageTable, args: dict, step: int, scheduled: int
) -> KernelStep:
    """With attention.impl=varlen, "kernel_step": the kernel's Python arguments
    (model/varlen.py): the windows in whole tokens (−1: none), the YaRN stage, and the
    stage's max_pieces and max_piece_len where the stage table sets them."""

    def whole(key: str) -> int:
        return math.floor(args[key]) if key in args else -1

    row_segments, max_len = cfg.attention.max_segments, 0
    if stages.rows:
        row = stages.row(step, scheduled)
        row_segments = row.max_pieces or row_segments
        max_len = row.max_piece_len or 0
    stage = int(args.get("yarn_stage", 0))
    long, short = whole("window_tokens"), whole("short_window_tokens")
    return KernelStep(long, short, stage, row_segments, max_len)


def yarn_windows(cfg: ModelConfig, stages: StageTable | None) -> list[int] | None:
    """With attention.yarn, the long windows in blocks, in order, whose changes rescale the
    rotary (model/yarn.py): each stage's, then the extension steps' if set
    (`StageTable.long_windows`); stage k = after k changes. None without yarn."""
    if not cfg.attention.yarn:
        return None
    return (stages or StageTable()).long_windows


def check_stages(cfg: ModelConfig, stages: StageTable) -> None:
    """Raise ValueError naming the key where the model's window settings and the stage
    table's window column disagree."""
    att = cfg.attention
    by_stage = bool(stages.column("window"))
    if by_stage and att.window_tokens:
        raise ValueError(
            "model.attention.window_tokens (a window growing linearly) and "
            "train.stages.rows.N.window (a window by stage) exclude each other: set one"
        )
    if by_stage and not att.window:
        raise ValueError(
            "train.stages.rows.N.window needs model.attention.window (which layers have the "
            "long window and which the short one)"
        )
    if not by_stage and bool(att.window) != bool(att.window_tokens):
        raise ValueError(
            "model.attention.window (which layers have sliding windows) and their width go "
            "together: a width by stage (train.stages.rows.N.window) or growing linearly "
            "(model.attention.window_tokens), or neither; got window="
            f"{att.window!r}, window_tokens={att.window_tokens} and no window by stage"
        )
    if att.yarn and not by_stage:
        raise ValueError(
            "model.attention.yarn needs the window by stage (train.stages.rows.N.window): it "
            "rescales the rotary at each change"
        )
