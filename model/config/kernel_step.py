"""The varlen attention kernel's Python arguments of a step (model.attention.impl=varlen,
model/varlen.py): in the config layer, torch-free, so the model's part of the schedule builds
them (model/forward_schedule.py `forward_args`) and the trainer passes them on."""

from typing import NamedTuple


class KernelStep(NamedTuple):
    """The varlen kernel's Python arguments for one training step (`forward_args`);
    an evaluation takes model.attention.max_segments and whole rows instead."""

    long: int  # the long window W in tokens (−1: none)
    short: int  # the short window in tokens (−1: none)
    yarn_stage: int  # the row of the model's YaRN scales (0 without YaRN)
    row_segments: int  # the most segments a row holds: the stage's max_pieces, or max_segments
    max_len: int  # the longest segment in tokens: the stage's piece cap, 0 = the row
