"""Optimizer state by name: one flat {"<group>/<parameter>/<key>": tensor} map.

torch's `Optimizer.state_dict()` numbers parameters by position, which suits one layout of
one world size. The flat map names every state tensor by its param group, its parameter's
qualified name and its key ("muon/blocks.0.attn.q.weight/momentum_buffer",
"embed/embed.weight/exp_avg"), holding the live tensors themselves: plain ones under DDP,
DTensor shards under FSDP. That is the form Distributed Checkpoint saves and loads in place
(resharding between world sizes), and the bridge between the two checkpoint formats:
`from_positional` reads a DDP checkpoint's positional states into it, `to_positional` turns
one back into states that `load_state_dict` takes.
"""

from typing import Any

import torch
from torch import Tensor

from optim.fsdp_rows import local, row_range


def names(opt: torch.optim.Optimizer) -> list[tuple[str, str, Tensor]]:
    """(group name, parameter name, parameter) for every parameter of `opt`, in order."""
    out = []
    for g in opt.param_groups:
        out += [(g["name"], n, p) for n, p in zip(g["param_names"], g["params"], strict=True)]
    return out


def flat_state(parts: list[torch.optim.Optimizer]) -> dict[str, Tensor]:
    """Every tensor of every part's state, by name (the live tensors, not copies)."""
    out = {}
    for opt in parts:
        for group, name, p in names(opt):
            for key, value in opt.state.get(p, {}).items():
                if isinstance(value, Tensor):
                    out[f"{group}/{name}/{key}"] = value
    return out


def from_positional(
    parts: list[torch.optim.Optimizer], states: list[dict[str, Any]]
) -> dict[str, Tensor]:
    """The flat map of positional `states` (a DDP checkpoint's), named after `parts`, whose
    layout must be the same (checked by the caller's `load_state_dict` rules)."""
    out = {}
    for opt, state in zip(parts, states, strict=True):
        numbers = [n for g in state["param_groups"] for n in g["params"]]
        for (group, name, _), number in zip(names(opt), numbers, strict=True):
            for key, value in state["state"].get(number, {}).items():
                out[f"{group}/{name}/{key}"] = value
    return out


def to_positional(
    parts: list[torch.optim.Optimizer], flat: dict[str, Tensor]
) -> list[dict[str, Any]]:
    """States that each part's `load_state_dict` takes, holding the values of `flat`."""
    states = []
    for opt in parts:
        sd = opt.state_dict()
        numbers = [n for g in sd["param_groups"] for n in g["params"]]
        state: dict[int, dict[str, Tensor]] = {}
        for (group, name, _), number in zip(names(opt), numbers, strict=True):
            prefix = f"{group}/{name}/"
            found = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
            if found:
                state[number] = found
        states.append({"state": state, "param_groups": sd["param_groups"]})
    return states


def whole_sum(key: str, target: Tensor, saved: Tensor) -> Tensor:
    """`saved` as `target` keeps it: an Adam pair's partial sum saved by sharded ranks, one
    stacked per rank (optim/adam.py), is kept whole here as the sum of averaged gradients,
    their mean; anything else as it is."""
    if key.endswith("/grad_sum") and saved.ndim == target.ndim + 1:
        return saved.sum(0).div_(saved.shape[0])
    return saved


@torch.no_grad()
def copy_global(target: Tensor, whole: Tensor) -> None:
    """Fill `target` (a plain tensor, or a dim-0 shard of a DTensor) from the whole tensor."""
    if tuple(target.shape) != tuple(whole.shape):
        raise ValueError(f"shape {tuple(whole.shape)} saved, {tuple(target.shape)} here")
    start, stop = row_range(target) if target.ndim else (0, 0)
    local(target).copy_(whole[start:stop] if target.ndim else whole)


@torch.no_grad()
def init_state(opt: torch.optim.Optimizer) -> None:
    """Create every missing state of `opt` now, equal to what its first step would create.

    A step with zero gradients and zero LR builds the state exactly as torch does (no private
    helpers); the parameters do not move (×(1 − 0·wd) and −0·m/(√v+ε) change nothing), and the
    step counters it advanced are reset. Sharded runs need this: a checkpoint or an offload
    must find every rank's state, not create it lazily on some ranks only.
    """
    missing = [p for g in opt.param_groups for p in g["params"] if p not in opt.state]
    if not missing:
        return
    lrs = [g["lr"] for g in opt.param_groups]
    every = [p for g in opt.param_groups for p in g["params"]]
    grads = {p: p.grad for p in every}
    needs = {id(p) for p in missing}
    for p in every:  # a parameter that has its state takes no part (its momentum stays)
        p.grad = torch.zeros_like(p) if id(p) in needs else None
    for g in opt.param_groups:
        g["lr"] = 0.0
    try:
        opt.step()
    finally:
        for g, lr in zip(opt.param_groups, lrs, strict=True):
            g["lr"] = lr
        for p, grad in grads.items():
            p.grad = grad
    for p in missing:  # the counters that step advanced (optim/adam.py's "pending" too)
        for key in ("step", "pending"):
            counter = opt.state[p].get(key)
            if isinstance(counter, Tensor):
                counter.zero_()
