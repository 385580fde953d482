"""Checks of a config that span its groups: what no one group can see alone.

The stage lists are the main case. A record's stages are several lists in four groups
(`train.seq_len_phases`, `model.attention.window_phases`, `data.max_piece_len_phases`,
`data.max_pieces`, `model.head.mtp_weights` and `optim.schedule.peaks` without
`peak_edges`), each splitting the scheduled steps into as many equal phases as it has
entries. Two lists of different lengths cut the run at different steps, which no record
does; a list of one entry is a constant and agrees with any.

And every number in the tree is finite: a NaN or infinite learning rate, scale or weight
would otherwise pass a `>= 0` check (NaN compares false) or train to NaN.
"""

import math
from dataclasses import fields, is_dataclass
from typing import Any


def stage_lists(conf: Any) -> dict[str, list]:
    """The config's equal-phase lists of two or more entries, by key."""
    lists = {
        "train.seq_len_phases": conf.train.seq_len_phases,
        "model.attention.window_phases": conf.model.attention.window_phases,
        "data.max_piece_len_phases": conf.data.max_piece_len_phases,
        "data.max_pieces": conf.data.max_pieces,
    }
    if conf.model.head.mtp:
        lists["model.head.mtp_weights"] = conf.model.head.mtp_weights
    if not conf.optim.schedule.peak_edges:  # with edges the peaks have their own phases
        lists["optim.schedule.peaks"] = conf.optim.schedule.peaks
    return {key: list(v) for key, v in lists.items() if len(v) > 1}


def check_finite(node: Any, prefix: str = "") -> None:
    """Every float of the dataclass tree `node`, alone or in a list or dict, is finite."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            check_finite(value, f"{key}.")
            continue
        items = value.values() if isinstance(value, dict) else value
        for v in items if isinstance(value, (list, tuple, dict)) else [value]:
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{key} must be a finite number, got {value}")


def check_across(conf: Any) -> None:
    """Raise ValueError naming the keys of the first check across groups that fails."""
    stages = stage_lists(conf)
    if len({len(v) for v in stages.values()}) > 1:
        listed = "; ".join(f"{key}={v} ({len(v)})" for key, v in stages.items())
        raise ValueError(
            f"the stage lists disagree on the number of stages: {listed}. Each splits the "
            "scheduled steps into equal phases, one per entry: give them all the same length"
        )
    if conf.optim.tie_embed_head_until and not conf.model.embed.tied_init:
        raise ValueError(
            "optim.tie_embed_head_until needs model.embed.tied_init=true (E starts as W)"
        )
    phases, scheduled = conf.model.attention.window_phases, conf.train.scheduled_steps
    if len(phases) > scheduled:
        raise ValueError(
            f"model.attention.window_phases has {len(phases)} phases, more than the "
            f"{scheduled} scheduled steps (train.steps - train.extension_steps)"
        )
    if conf.train.seq_len_phases and conf.data.source != "synthetic" and conf.data.align == "bos":
        raise ValueError(
            "train.seq_len_phases changes the sequence length by phase, which "
            "data.align=bos cannot follow (its rows are one length): use data.align=pieces "
            "or stream"
        )
    if conf.model.attention.impl == "flex" and conf.train.device == "cpu":
        raise ValueError(
            "model.attention.impl=flex can't train on a CPU (FlexAttention has no CPU "
            "backward in this torch); use model.attention.impl=auto or sdpa there"
        )
