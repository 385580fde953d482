"""The parameter-group table: the one place a param group is declared.

Each row names a group, the role of the parameters it takes (optim/partition.py), the
optimizer that steps it, the config key of its LR, and whether it takes the schedule's Muon
momentum. The group's name is its `lr/<name>` log key and the prefix of its state in
checkpoints. Betas, eps and weight decay come from its optimizer's settings (`optim.adamw`,
`optim.muon`). `optim.name` picks the row for the hidden matrices: Muon's, or an AdamW group.

A new group is a new row (and a role for its parameters); `build_optimizer` builds it,
`describe_groups` prints it at startup with the parameters it holds.
"""

from dataclasses import dataclass
from functools import reduce

from torch import nn

from optim.config import OptimConfig
from optim.partition import Named, param_roles


@dataclass(frozen=True)
class GroupSpec:
    name: str
    role: str  # which parameters (optim/partition.py)
    optimizer: str  # "muon" | "adamw"
    lr_key: str  # the `optim.*` key of its base LR
    scheduled_momentum: bool = False  # takes the schedule's Muon momentum every step
    only_with: str = ""  # the optim.name this row belongs to ("" = every)


GROUPS = (
    GroupSpec("muon", "matrix", "muon", "muon.lr", scheduled_momentum=True,
              only_with="muon_adamw"),
    GroupSpec("hidden", "matrix", "adamw", "adamw.hidden_lr", only_with="adamw"),
    GroupSpec("embed", "embed", "adamw", "adamw.embed_lr"),
    GroupSpec("head", "head", "adamw", "adamw.head_lr"),
    GroupSpec("scalar", "scalar", "adamw", "adamw.scalar_lr"),
)  # fmt: skip


def group_specs(optimizer_name: str) -> list[GroupSpec]:
    """The table's rows for `optim.name`, in build order (a checkpoint lists groups so)."""
    names = {g.only_with for g in GROUPS} - {""}
    if optimizer_name not in names:
        raise ValueError(f"optimizer_name must be one of {sorted(names)}, got {optimizer_name!r}")
    return [g for g in GROUPS if g.only_with in ("", optimizer_name)]


def base_lr(spec: GroupSpec, cfg: OptimConfig) -> float:
    """The group's base LR: its `lr_key` read from `cfg`."""
    return reduce(getattr, spec.lr_key.split("."), cfg)


def partition_params(
    model: nn.Module, optimizer_name: str, routes: dict[str, str] | None = None
) -> dict[str, Named]:
    """The trainable parameters of `model` by group name, for `optim.name`: {group:
    [(qualified name, parameter)]}, every group of the table present (maybe empty).
    `routes`: `optim.roles` (optim/partition.py)."""
    specs = group_specs(optimizer_name)
    roles = param_roles(model, routes)
    return {g.name: roles[g.role] for g in specs}


def describe_groups(cfg: OptimConfig, groups: dict[str, Named]) -> str:
    """The table as the startup log prints it: each group's optimizer, LR, betas or momentum,
    eps, weight decay, and the parameters it holds (count, elements, first names)."""
    a, m = cfg.adamw, cfg.muon
    rows = [("group", "optimizer", "lr", "betas / momentum", "eps", "wd", "tensors", "params",
             "holds")]  # fmt: skip
    for spec in group_specs(cfg.name):
        named = groups.get(spec.name, [])
        if spec.optimizer == "muon":
            moment = f"{m.momentum_warmup_start:g}->{m.momentum:g} over {m.momentum_warmup_steps}"
            kind = f"NorMuon (beta2 {m.normuon_beta2:g})" if m.normuon_beta2 else "Muon"
            decay = f"{m.weight_decay:g}" + (
                " cautious" if m.weight_decay_form == "cautious" else ""
            )
            settings = (kind, moment, "-", decay)
        else:
            kind = "AdamW" if a.torch_equivalent else "Adam"
            if a.update_every > 1:
                kind += f" every {a.update_every}"
            cautious = a.weight_decay_form == "cautious"
            decay = f"{a.weight_decay:g}" + (" cautious" if cautious else "")
            settings = (kind, f"({a.beta1:g}, {a.beta2:g})", f"{a.eps:g}", decay)
        names = ", ".join(n for n, _ in named[:2]) + (", ..." if len(named) > 2 else "")
        elements = sum(p.numel() for _, p in named)
        rows.append((spec.name, settings[0], f"{base_lr(spec, cfg):g}", *settings[1:],
                     str(len(named)), f"{elements:,}", names or "-"))  # fmt: skip
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)  # fmt: skip
