"""Adam's state in a checkpoint (optim/adam.py): what torch's load_state_dict and state_dict
do not keep as the optimizer runs it. The moments in their own dtype (`optim.adamw.state_dtype`),
the partial gradient sums of `update_every` (kept by rank, or averaged), and a sharded run's
rows gathered whole on saving and taken back on loading. `opt` is an `Adam`."""

from typing import Any

import torch
from torch import Tensor

MOMENT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # "param": the parameter's


def restore_saved(opt: Any, state_dict: dict[str, Any]) -> None:
    """After torch's load_state_dict, which casts loaded state to the parameter's dtype: the
    moments and the counters taken again from the saved values in their own dtypes (fp32
    moments of a bf16 parameter would otherwise lose their low bits), the pair's partial
    sums as this run keeps them (`saved_sum`), and a sharded run's rows of each."""
    ids = [i for g in state_dict["param_groups"] for i in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in zip(ids, params, strict=True):
        saved, state = state_dict["state"].get(i, {}), opt.state.get(p, {})
        moments = MOMENT_DTYPES.get(opt.hp.state_dtype, p.dtype)
        for key, dtype in (("exp_avg", moments), ("exp_avg_sq", moments),
                           ("pending", torch.float32), ("step", torch.float32)):  # fmt: skip
            if key in saved and key in state:
                state[key] = saved[key].to(state[key].device, dtype, copy=True)
        if "grad_sum" in saved and "grad_sum" in state:
            state["grad_sum"] = saved_sum(opt, p, saved["grad_sum"])
        if opt.shards is not None:  # this rank's rows of the whole saved state
            for key, value in state.items():
                if key != "grad_sum" or not opt.local_sums:
                    state[key] = opt.shards.mine(p, value)


def saved_sum(opt: Any, p: Tensor, saved: Tensor) -> Tensor:
    """A saved partial sum of a pair as this run keeps it. Saved stacked (a sharded run's
    ranks' own sums, `state_dict`) or whole (a sum of averaged gradients). Kept by rank
    (local_sums): the same number of ranks take their own; otherwise rank 0 takes what
    the saved sums average to times this run's world and the others zeros, so that the
    update's average over ranks is the saved one. Kept averaged: the average."""
    saved = saved.to(p.device, p.dtype)
    ranks = saved.shape[0] if saved.ndim == p.ndim + 1 else 0
    if (saved.shape[1:] if ranks else saved.shape) != p.shape:
        raise ValueError(
            f"Adam's saved gradient sum {tuple(saved.shape)} fits neither the parameter "
            f"{tuple(p.shape)} nor a stack of its ranks' sums: the checkpoint is another "
            "model's (train.resume)"
        )
    if not opt.local_sums:
        return saved.sum(0).div_(ranks) if ranks else saved.clone()
    assert opt.shards is not None  # local_sums implies sharded
    world, rank = opt.shards.world, opt.shards.comm.rank
    if ranks == world:
        return saved[rank].clone()
    if rank:
        return torch.zeros_like(p)
    mean = saved.sum(0).div_(ranks) if ranks else saved
    return mean.mul(world)


def gathered(opt: Any, sd: dict[str, Any]) -> dict[str, Any]:
    """torch's state dict `sd` of `opt`; sharded, every tensor's state gathered whole from the
    ranks that hold its rows (a collective: every rank must call it)."""
    if opt.shards is None:
        return sd
    ids = [i for g in sd["param_groups"] for i in g["params"]]
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in zip(ids, params, strict=True):
        # torch packs the live state dicts: the whole tensors go into a copy, or the
        # run would go on with them in place of its rows
        state = dict(sd["state"].get(i, {}))
        for key, value in state.items():
            if key == "grad_sum" and opt.local_sums:
                # every rank's own sum inside a pair; between pairs none is kept (the
                # last period's first gradient stays in the buffer, unread)
                inside = int(state["pending"]) > 0
                state[key] = opt.shards.stacked(value) if inside else torch.zeros_like(value)
            else:
                state[key] = opt.shards.whole(p, value)
        if state:
            sd["state"][i] = state
    return sd
