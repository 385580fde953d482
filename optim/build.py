"""From the `optim` config to the optimizer object of a model: the one place it crosses in.

"muon_adamw": Muon on the hidden matrices, plus one AdamW with a param group (and LR) each for
the embedding, the LM head and the 0-D/1-D scalars. "adamw": a single AdamW, the hidden
matrices in a group of their own. Which parameter goes where is `partition_params`'s rule.
Every group is built with its LR as both "lr" and "initial_lr" (the base LR that
`CombinedOptimizer.schedule` multiplies), here and nowhere else.
"""

import torch
import torch.distributed as dist
from torch import nn

from optim.combined import CombinedOptimizer
from optim.config import OptimConfig
from optim.muon import Muon
from optim.newton_schulz import resolve_ns_dtype
from optim.offload import StateOffload
from optim.partition import partition_params
from optim.qk_clip import QKClip
from optim.schedule import Schedules
from optim.sharded_muon import ShardedMuon


def build_optimizer(
    model: nn.Module,
    cfg: OptimConfig,
    *,
    total_steps: int,
    device: torch.device,
    process_group: dist.ProcessGroup | None = None,
    sharded: bool = False,
) -> CombinedOptimizer:
    """The optimizer object for `model`'s trainable parameters, on `device`.

    With a `process_group` Muon splits its Newton–Schulz work across the group's ranks
    (`optim.muon.exchange`); AdamW needs none: DDP gives every rank the same gradients.
    `sharded`: the parameters are FSDP2 shards (dist.strategy=fsdp): Muon is `ShardedMuon`
    (its exchange follows from the shards, so `optim.muon.exchange` does not apply;
    `optim.muon.sharded_ns` says whether shards go to an owner or stay in place), AdamW
    steps the shards, and every state is created now, on every rank.
    """
    groups = partition_params(model, cfg.name)
    a, m = cfg.adamw, cfg.muon
    adamw_lrs = {"hidden": a.hidden_lr, "embed": a.embed_lr, "head": a.head_lr}
    adamw_lrs["scalar"] = a.scalar_lr
    adamw_groups = [_group(name, groups.get(name, []), lr) for name, lr in adamw_lrs.items()]
    parts: list[torch.optim.Optimizer] = []
    summary = cfg.name
    self_reduced: list[str] = []
    if groups.get("muon"):
        ns_dtype = resolve_ns_dtype(m.ns_dtype, device)
        settings = {
            "momentum": m.momentum,
            "nesterov": m.nesterov,
            "momentum_form": m.momentum_form,
            "ns_steps": m.ns_steps,
            "ns_coefficients": m.ns_coefficients,
            "lr_scale": m.lr_scale,
            "ns_form": m.ns_form,
            "weight_decay": m.weight_decay,
            "eps": m.eps,
            "ns_dtype": ns_dtype,
        }
        muon_group = [_group("muon", groups["muon"], m.lr)]
        if sharded:
            parts.append(ShardedMuon(muon_group, **settings, sharded_ns=m.sharded_ns))
        else:
            parts.append(
                Muon(muon_group, **settings, process_group=process_group, exchange=m.exchange)
            )
        dtype = str(ns_dtype).removeprefix("torch.")
        ranks = process_group is not None and dist.get_world_size(process_group) > 1
        exchange = m.exchange
        if sharded:
            exchange = "sharded all_to_all" if m.sharded_ns == "gather" else "tensor-parallel"
        summary += f" (Newton-Schulz in {dtype}" + (f", exchange {exchange})" if ranks else ")")
        if ranks and m.exchange == "reduce_scatter" and not sharded:
            # Muon sends each gradient to its owner itself: DDP must leave these alone.
            self_reduced = [name for name, _ in groups["muon"]]
    adamw_groups = [g for g in adamw_groups if g["params"]]
    if adamw_groups:
        parts.append(
            torch.optim.AdamW(
                adamw_groups,
                betas=(a.beta1, a.beta2),
                eps=a.eps,
                weight_decay=a.weight_decay,
                fused=device.type == "cuda",  # one kernel for all tensors; CUDA only here
            )
        )
    schedules = Schedules(
        total_steps=total_steps,
        lr=cfg.schedule,
        momentum_warmup_steps=m.momentum_warmup_steps,
        momentum_start=m.momentum_warmup_start,
        momentum=m.momentum,
    )
    offload = StateOffload(parts, device) if cfg.offload else None
    if offload is not None:
        summary += ", state offloaded to CPU"
    clip = None
    if m.qk_clip > 0:
        clip = QKClip(model, m.qk_clip, process_group)
        summary += f", QK-clip at {m.qk_clip:g}"
    combined = CombinedOptimizer(parts, schedules, summary, self_reduced, offload, clip)
    if sharded or offload is not None:
        combined.init_state()
    if offload is not None:
        offload.store_all()
    return combined


def _group(name: str, named: list[tuple[str, nn.Parameter]], lr: float) -> dict:
    # Named parameters: each group's "param_names" name the state in flat form and in DCP.
    return {"params": list(named), "lr": lr, "initial_lr": lr, "name": name}
