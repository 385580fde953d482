"""From the `optim` config to the optimizer object of a model: the one place it crosses in.

The param groups are the rows of the table in optim/groups.py: with optim.name=muon_adamw,
Muon on the hidden matrices and one AdamW with a param group (and LR) each for the
embeddings, the LM head and the 0-D/1-D scalars; with adamw, one AdamW with the hidden
matrices in a group of their own. Every group is built with its LR as both "lr" and
"initial_lr" (the base LR that `CombinedOptimizer.set_step` multiplies), here and nowhere else.
"""

import fnmatch

import torch
import torch.distributed as dist
from torch import nn

from optim.adam import Adam
from optim.adam_table import describe_table, resolve_table
from optim.combined import CombinedOptimizer
from optim.config import OptimConfig
from optim.ddp_rows import Comm, ProcessComm
from optim.groups import GroupSpec, base_lr, describe_groups, group_specs, partition_params
from optim.muon.normuon import mark_head_pairs
from optim.muon.ns_dtype import resolve_ns_dtype
from optim.muon.optimizer import Muon
from optim.muon.stacks import mark_stacks
from optim.offload import StateOffload
from optim.parallelism import DEFAULT, PARALLELISMS
from optim.partition import Named
from optim.qk_clip import QKClip
from optim.tied import attach as attach_tie


def build_optimizer(
    model: nn.Module,
    cfg: OptimConfig,
    *,
    device: torch.device,
    process_group: dist.ProcessGroup | None = None,
    parallelism: str = DEFAULT,
    comm: Comm | None = None,
) -> CombinedOptimizer:
    """The optimizer object for `model`'s trainable parameters, on `device`.

    `parallelism` (dist.parallelism, optim/parallelism.py) says how the `process_group`'s
    ranks share the work. ddp_all_gather | ddp_all_reduce | ddp_owners: Muon splits its
    Newton–Schulz work across the ranks with that exchange; AdamW needs none, DDP gives every
    rank the same gradients. fsdp_gather | fsdp_tp: the parameters are FSDP2 shards; Muon runs
    its sharded strategy, AdamW steps the shards, and every state is created now, on every
    rank. ddp_row_shards on several ranks: the optimizer shares its work and state out over
    `process_group` itself (optim/ddp_rows.py), every gradient skips DDP; `comm` gives that
    exchange directly (a `LocalView`: one rank's share of a W-rank step, in one process,
    scripts/bench/gpu.py --world).
    """
    several = process_group is not None and dist.get_world_size(process_group) > 1
    row_shards = parallelism == "ddp_row_shards"
    if comm is None and row_shards and several:
        comm = ProcessComm(process_group)
    if comm is not None:
        if parallelism not in (DEFAULT, "ddp_row_shards"):
            raise ValueError(f"a `comm` is ddp_row_shards' exchange; got {parallelism}")
        parallelism = "ddp_row_shards"
        process_group = None  # the exchange replaces DDP and Muon's own exchanges
    sharded = PARALLELISMS[parallelism].fsdp
    named = partition_params(model, cfg.name, cfg.roles)
    specs = group_specs(cfg.name)
    _set_lr_muls(named, specs, cfg)
    muon_named = [pair for s in specs if s.optimizer == "muon" for pair in named[s.name]]
    mark_head_pairs(model, muon_named, cfg.muon.qk_split)
    mark_stacks(muon_named, cfg.muon.expert_keys)
    parts: list[torch.optim.Optimizer] = []
    summary = cfg.name
    self_reduced: list[str] = []
    muon_groups = [g for s in specs if s.optimizer == "muon" for g in _ns_groups(s, named, cfg)]
    backend = cfg.compile_backend if cfg.compile else None
    if any(g["params"] for g in muon_groups):
        m = cfg.muon
        ns_dtype = resolve_ns_dtype(m.ns_dtype, device)
        muon = Muon(
            [g for g in muon_groups if g["params"]], m, ns_dtype=ns_dtype,
            process_group=process_group, parallelism=parallelism, banks=cfg.compile,
            compile_backend=backend, comm=comm,
        )  # fmt: skip
        parts.append(muon)
        ranks = process_group is not None and dist.get_world_size(process_group) > 1
        exchange = PARALLELISMS[parallelism].muon
        if sharded:
            exchange = "sharded all_to_all" if exchange == "gather" else "tensor-parallel"
        if comm is not None:
            ranks, exchange = True, f"sharded over {comm.world} ranks"
        dtype = str(ns_dtype).removeprefix("torch.")
        summary += f" (Newton-Schulz in {dtype}" + (f", exchange {exchange})" if ranks else ")")
        if muon.strategy.reduces_gradients:
            # Muon sends each gradient to its owner itself: DDP must leave these alone.
            self_reduced = [n for s in specs if s.optimizer == "muon" for n, _ in named[s.name]]
    adamw_groups = [_group(s, named[s.name], cfg) for s in specs if s.optimizer == "adamw"]
    adamw_groups = [g for g in adamw_groups if g["params"]]
    by_optimizer = {o: [x for s in specs if s.optimizer == o for x in named[s.name]]
                    for o in ("adamw", "muon")}  # fmt: skip
    rows = resolve_table(by_optimizer["adamw"], by_optimizer["muon"], cfg)
    if adamw_groups:
        a = cfg.adamw
        if a.torch_equivalent and comm is None and not rows:  # torch's: one fused kernel on CUDA
            parts.append(
                torch.optim.AdamW(
                    adamw_groups, betas=(a.beta1, a.beta2), eps=a.eps,
                    weight_decay=a.weight_decay,
                    fused=device.type == "cuda",  # one kernel for all tensors; CUDA only here
                )
            )  # fmt: skip
        else:
            parts.append(Adam(adamw_groups, a, rows, compile_backend=backend, comm=comm))
            if cfg.tie_embed_head_until:
                attach_tie(parts, named, cfg.tie_embed_head_until, a.update_every,
                           cfg.tie_sum == "step")  # fmt: skip
            summary += f" (Adam: eps {a.eps_placement}, {a.state_dtype} moments"
            if cfg.compile:
                summary += ", compiled"
            if a.weight_decay_form == "cautious":
                summary += ", cautious decay"
            summary += f", every {a.update_every} steps)" if a.update_every > 1 else ")"
            if cfg.tie_embed_head_until:
                summary += f", embed tied to the head until step {cfg.tie_embed_head_until}"
    offload = StateOffload(parts, device) if cfg.offload else None
    if offload is not None:
        summary += ", state offloaded to CPU"
    clip = None
    if cfg.muon.qk_clip > 0:
        clip = QKClip(model, cfg.muon.qk_clip, process_group, list(cfg.muon.qk_clip_heads))
        summary += f", QK-clip at {cfg.muon.qk_clip:g}"
    table = describe_groups(cfg, named)
    for pattern, row in cfg.muon.rows().items():  # optim.muon.table, as the groups show it
        count = next(len(g["params"]) for g in muon_groups if g.get("pattern") == pattern)
        settings = ", ".join(f"{k} {v}" for k, v in row.given().items())
        table += f"\n  optim.muon.table {pattern!r}: {settings} ({count} matrices)"
    if rows:
        table += "\n" + describe_table(rows)
    if comm is not None:  # every gradient is reduced by the optimizer, not DDP
        self_reduced = [n for s in specs for n, _ in named[s.name]]
    combined = CombinedOptimizer(parts, summary, table, self_reduced, offload, clip,
                                 exchanges=comm is not None)  # fmt: skip
    if sharded or offload is not None:
        combined.init_state()
    if offload is not None:
        offload.store_all()
    return combined


def _group(spec: GroupSpec, named: Named, cfg: OptimConfig) -> dict:
    # Named parameters: each group's "param_names" name the state in flat form and in DCP.
    lr = base_lr(spec, cfg)
    group = {"params": list(named), "lr": lr, "initial_lr": lr, "name": spec.name}
    if spec.scheduled_momentum:
        group["scheduled_momentum"] = True
    return group


def _ns_groups(spec: GroupSpec, named: dict[str, Named], cfg: OptimConfig) -> list[dict]:
    """The Muon group's param groups: its matrices that no row of `optim.muon.table` names,
    then one group for each row's (carrying the row's Newton–Schulz settings, named
    "muon_row<k>" after the row's place), each in the model's order. A pattern that names
    no Muon parameter, or a parameter two patterns name, is an error naming it."""
    rows = cfg.muon.rows()
    members: dict[str, Named] = {"": [], **{pattern: [] for pattern in rows}}
    for name, p in named[spec.name]:
        hits = [pattern for pattern in rows if fnmatch.fnmatchcase(name, pattern)]
        if len(hits) > 1:
            raise ValueError(f"optim.muon.table: {name!r} matches {hits}; give it one row")
        members[hits[0] if hits else ""].append((name, p))
    unmatched = [pattern for pattern in rows if not members[pattern]]
    if unmatched:
        raise ValueError(f"optim.muon.table: {unmatched} match no Muon parameter")
    groups = [_group(spec, members[""], cfg)] if members[""] else []
    for k, (pattern, row) in enumerate(rows.items()):
        # a group's name is its log key and its state's prefix: one per row
        group = {**_group(spec, members[pattern], cfg), **row.given(), "pattern": pattern}
        groups.append(group | {"name": f"{spec.name}_row{k}"})
    return groups


def _set_lr_muls(named: dict[str, Named], specs: list[GroupSpec], cfg: OptimConfig) -> None:
    """Mark each parameter with its `optim.lr_mul` factor (1 where no pattern matches) as the
    attribute `lr_mul` the optimizers read; a pattern that matches nothing, or a parameter
    of torch's AdamW (which has no per-parameter LR), is an error naming it."""
    torch_adamw = cfg.adamw.torch_equivalent
    matched = set()
    for spec in specs:
        for name, p in named[spec.name]:
            factors = [f for pat, f in cfg.lr_mul.items() if fnmatch.fnmatchcase(name, pat)]
            matched.update(pat for pat in cfg.lr_mul if fnmatch.fnmatchcase(name, pat))
            if len(set(factors)) > 1:
                raise ValueError(
                    f"optim.lr_mul: parameter {name!r} matches patterns with different factors"
                )
            if factors and spec.optimizer == "adamw" and torch_adamw:
                raise ValueError(
                    f"optim.lr_mul matches {name!r}, a parameter of torch's AdamW, which has no "
                    "per-parameter LR: set one of optim.adamw.eps_placement / state_dtype / "
                    "update_every to use optim/adam.py, or change the group's LR"
                )
            p.lr_mul = factors[0] if factors else 1.0  # type: ignore[attr-defined]
    unmatched = [pat for pat in cfg.lr_mul if pat not in matched]
    if unmatched:
        raise ValueError(f"optim.lr_mul: {unmatched} match no trainable parameter")
