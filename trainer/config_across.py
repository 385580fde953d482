"""Checks of a config that span its groups: what no one group can see alone.

The stage table is the main case. Its rows (train.stages, stages/table.py) hold what the
model, the data and the optimizer do in each stage, so each column must suit the group that
reads it: the piece columns need data.align=pieces and data.max_piece_len their largest,
the LR plateaus a cooldown that falls from them, the MTP weights model.head.mtp (and it
them). The windows by stage are the model config's own check (`ModelConfig.validate`, which
sees the table: the model builds its YaRN stages from it). One row per stage makes a
disagreement on the number of stages impossible.

And every number in the tree is finite: a NaN or infinite learning rate, scale or weight
would otherwise pass a `>= 0` check (NaN compares false) or train to NaN.
"""

import math
from dataclasses import fields, is_dataclass
from typing import Any

from model.config.tensor_parallel import check_tensor_parallel


def check_finite(node: Any, prefix: str = "") -> None:
    """Every float of the dataclass tree `node`, alone or in a list or dict (a row of a list
    of dataclasses too, named by its index), is finite."""
    for f in fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if is_dataclass(value):
            check_finite(value, f"{key}.")
            continue
        items = value.values() if isinstance(value, dict) else value
        for i, v in enumerate(items if isinstance(value, (list, tuple, dict)) else [value]):
            if is_dataclass(v):
                check_finite(v, f"{key}.{i}.")
            elif isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{key} must be a finite number, got {value}")


def check_stages(conf: Any) -> None:
    """Raise ValueError naming the stage column (and the key of the group that reads it) that
    does not suit that group."""
    table, data = conf.train.stages, conf.data
    for column in ("max_piece_len", "max_pieces"):
        if table.column(column) and data.align != "pieces":
            raise ValueError(
                f"train.stages.rows.N.{column} only applies to data.align=pieces "
                f"(data.align={data.align}); leave it 0"
            )
    caps = table.column("max_piece_len")
    if caps and data.max_piece_len != max(caps):
        raise ValueError(
            f"data.max_piece_len ({data.max_piece_len}) must equal the largest of the stages' "
            f"max_piece_len (train.stages.rows.N.max_piece_len: {max(caps)})"
        )
    if table.column("seq_len") and data.source != "synthetic" and data.align == "bos":
        raise ValueError(
            "train.stages.rows.N.seq_len changes the sequence length by stage, which "
            "data.align=bos cannot follow (its rows are one length): use data.align=pieces "
            "or stream"
        )
    form = conf.optim.schedule.cooldown_form
    if table.column("lr_peak") and form not in ("fraction", "from_step"):
        raise ValueError(
            "train.stages.rows.N.lr_peak needs optim.schedule.cooldown_form=fraction or "
            f"from_step (the cooldown falls from a stage's peak), got {form!r}"
        )
    mtp, weights = conf.model.head.mtp, bool(table.column("mtp_weights"))
    if mtp != weights:
        raise ValueError(
            "model.head.mtp=true needs the weights by stage, train.stages.rows.N.mtp_weights"
            if mtp
            else "train.stages.rows.N.mtp_weights weigh model.head.mtp's loss: set it, or "
            "leave them []"
        )


def check_across(conf: Any) -> None:
    """Raise ValueError naming the keys of the first check across groups that fails."""
    check_stages(conf)
    if conf.optim.tie_embed_head_until and not conf.model.embed.tied_init:
        raise ValueError(
            "optim.tie_embed_head_until needs model.embed.tied_init=true (E starts as W)"
        )
    tp = conf.dist.tensor_parallel
    check_tensor_parallel(conf.model, tp)
    if tp > 1 and conf.optim.muon.qk_clip:  # a head's maximum needs all of its rank's logits
        raise ValueError(
            f"dist.tensor_parallel={tp} splits the heads over ranks; optim.muon.qk_clip works "
            "across all of them: turn it off or leave dist.tensor_parallel=1"
        )
    if conf.model.attention.impl == "flex" and conf.train.device == "cpu":
        raise ValueError(
            "model.attention.impl=flex can't train on a CPU (FlexAttention has no CPU "
            "backward in this torch); use model.attention.impl=auto or sdpa there"
        )
