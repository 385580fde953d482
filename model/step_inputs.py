"""The forward's step arguments as the layers use them.

The schedule (trainer/schedule.py, model/forward_schedule.py) hands them over as 0-d float
tensors, so a compiled model does not recompile as they change: the long window in tokens,
the short one (token windows only) and the YaRN stage. Here they become what the masks and
the attention take: windows in blocks (⌈W/b⌉, N(s)) or in tokens (⌊W⌋: i − j ≤ W holds iff
it holds for ⌊W⌋), the stage as an index, and the stage's attention scale, read on the device
so that there is no host sync.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

from model.config import AttentionConfig


@dataclass(frozen=True)
class StepInputs:
    window: Tensor | None  # the long window: blocks, or tokens with token windows
    short: Tensor | None  # the short window in tokens (token windows only)
    yarn_stage: Tensor | None  # int64
    attn_scale: Tensor | None  # the stage's attention scale (fp64)


def step_inputs(
    cfg: AttentionConfig,
    yarn_scales: Tensor | None,
    window_tokens: Tensor | None,
    short_window_tokens: Tensor | None,
    yarn_stage: Tensor | None,
) -> StepInputs:
    """The layers' view of the step arguments (module docstring); `yarn_scales`: the model's
    table of attention scales by stage (None without YaRN)."""
    window = short = None
    if window_tokens is not None and cfg.window_granularity == "token":
        window = torch.floor(torch.as_tensor(window_tokens)).long()
        if short_window_tokens is not None:
            short = torch.floor(torch.as_tensor(short_window_tokens)).long()
    elif window_tokens is not None:
        window = torch.ceil(window_tokens / cfg.window_block).long()
    stage = yarn_stage.long() if cfg.yarn and yarn_stage is not None else None
    scale = None
    if stage is not None and yarn_scales is not None:
        scale = yarn_scales.index_select(0, stage.reshape(1))[0]
    return StepInputs(window, short, stage, scale)
