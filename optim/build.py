"""Build the optimizers for a model from `OptimConfig`, and apply the schedules each step.

"muon_adamw": Muon on the hidden matrices, plus one AdamW with a param group (and LR) each for
the embedding, the LM head and the 0-D/1-D scalars. "adamw": a single AdamW, the hidden
matrices in a group of their own. Which parameter goes where is `partition_params`'s rule.

Every param group keeps the LR it was built with as `initial_lr`; `apply_schedules` sets
`lr = initial_lr × multiplier` before each step, so a resumed run (whose groups come back
from the checkpoint) follows the same schedule.
"""

import torch
import torch.distributed as dist
from torch import nn

from optim.config import OptimConfig
from optim.muon import Muon
from optim.partition import partition_params
from optim.schedule import lr_multiplier, muon_momentum


def build_optimizers(
    model: nn.Module,
    cfg: OptimConfig,
    device_type: str,
    ns_dtype: torch.dtype = torch.bfloat16,
    process_group: dist.ProcessGroup | None = None,
) -> list[torch.optim.Optimizer]:
    """[Muon, AdamW] for "muon_adamw" or [AdamW] for "adamw"; empty groups are left out.

    `ns_dtype` is the Newton–Schulz precision that `optim.muon.ns_dtype` resolved to. With a
    `process_group` Muon splits its Newton–Schulz work across the group's ranks
    (`optim.muon.exchange`); AdamW needs none: DDP gives every rank the same gradients.
    """
    groups = partition_params(model, cfg.name)
    a = cfg.adamw
    adamw_lrs = {
        "hidden": a.hidden_lr,
        "embed": a.embed_lr,
        "head": a.head_lr,
        "scalar": a.scalar_lr,
    }
    adamw_groups = [
        {"params": [p for _, p in groups[name]], "lr": lr, "initial_lr": lr, "name": name}
        for name, lr in adamw_lrs.items()
        if groups.get(name)
    ]
    optimizers: list[torch.optim.Optimizer] = []
    if groups.get("muon"):
        m = cfg.muon
        optimizers.append(
            Muon(
                [{"params": [p for _, p in groups["muon"]], "name": "muon"}],
                lr=m.lr,
                momentum=m.momentum,
                nesterov=m.nesterov,
                ns_steps=m.ns_steps,
                ns_coefficients=m.ns_coefficients,
                lr_scale=m.lr_scale,
                weight_decay=m.weight_decay,
                eps=m.eps,
                ns_dtype=ns_dtype,
                process_group=process_group,
                exchange=m.exchange,
            )
        )
    if adamw_groups:
        optimizers.append(
            torch.optim.AdamW(
                adamw_groups,
                betas=(a.beta1, a.beta2),
                eps=a.eps,
                weight_decay=a.weight_decay,
                fused=device_type == "cuda",  # one kernel for all tensors; CUDA only here
            )
        )
    if not optimizers:
        raise ValueError("the model has no trainable parameters to optimize")
    return optimizers


def ddp_ignored_params(model: nn.Module, cfg: OptimConfig) -> list[str]:
    """Names of the parameters DDP must not reduce: Muon's, when its exchange reduces them.

    With `optim.muon.exchange=reduce_scatter` Muon sends each gradient to its owner itself, so
    an all-reduce by DDP would be duplicate traffic.
    """
    if cfg.name != "muon_adamw" or cfg.muon.exchange != "reduce_scatter":
        return []
    return [name for name, _ in partition_params(model, cfg.name)["muon"]]


def apply_schedules(
    optimizers: list[torch.optim.Optimizer], step: int, total_steps: int, cfg: OptimConfig
) -> float:
    """Set every group's LR (and Muon's momentum) for `step`; return the LR multiplier."""
    s = cfg.schedule
    mult = lr_multiplier(step, total_steps, s.warmup_steps, s.cooldown_frac, s.min_lr_frac)
    m = cfg.muon
    momentum = muon_momentum(step, m.momentum_warmup_steps, m.momentum_warmup_start, m.momentum)
    for opt in optimizers:
        for group in opt.param_groups:
            group["lr"] = group["initial_lr"] * mult
            if isinstance(opt, Muon):
                group["momentum"] = momentum
    return mult
