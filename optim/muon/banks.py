"""Muon over banks: a param group's matrices of one shape stacked, and one update for the
whole group (`optim.compile`; `optim.distribute=sharded` shares the banks out by rows).

A bank is every parameter of a Muon param group with the same shape, dtype and head-pair
split, in the group's order (record D: the ten (4, 768, 768) W_q, W_k, W_v, W_o stacks, and
the 22 MLP matrices, C_fc and C_proj alike, 3,072 × 768). Its state is stacked too: the
momentum (k, *shape), NorMuon's second moments (one stack per kind of piece: the head-pair
blocks, then W_v and W_o) and the fp32 master's low halves. Each parameter's entries in the
optimizer's state are views of those stacks (row j of each), so `state_dict()`, the
checkpoints and Distributed Checkpoint see the per-parameter state they always saw, and a
checkpoint moves freely between the banked and the per-parameter step.

`group_update` is one step of a group, for the rows of each bank a rank updates (all of them
in one process):

    momentum            B ← lerp(B, G, 1 − μ);  U = lerp(G, B, μ)          (optim/muon/update.py)
    Newton–Schulz       every piece of every bank, batched by shape      (newton_schulz.py)
    NorMuon             each kind of piece with its own second moments   (normuon.py)
    the update          on the weights, or on their fp32 masters         (update.py, master.py)

It is the per-parameter path's arithmetic, op for op, on stacks: each product or sum runs in
the same dtype and order, and every value that changes during a run (the LR, the momentum,
the decay coefficient λ·η) enters as a 0-d float64 tensor computed on the host exactly as the
per-parameter path computes its Python float (`host_values`), so `torch.compile` builds the
step once and nothing recompiles as those values change. Two places differ from the
per-parameter path in their last bit where ATen fuses a multiply and an add into one rounding
(`add(x, y, alpha=a)` and Nesterov's `g.add(buf, alpha=μ)`), which a stack with one factor per
row cannot call: there the banked step rounds the product first. Record D's step (an fp32
master, EMA momentum) has neither, and its banked step equals the per-parameter one bit for
bit when run uncompiled (tests/unit/test_muon_banks.py). Compiled, inductor keeps fused
intermediates in fp32 and may contract a multiply and an add, so the compiled step equals
the uncompiled one to those roundings (docs/optimizer-speed.md gives the measured sizes).
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from optim.config import MuonConfig
from optim.muon.master import master_of, truncate
from optim.muon.newton_schulz import RECORD_FORMS, coefficient_set, ns_coefficients, zeropower
from optim.muon.normuon import head_rows, moment_shape, normalise, stat_dim
from optim.muon.update import in_place_factors, lr_scale_factor
from optim.shards import cut

# The host values a step needs (`host_values`), each a 0-d float64 tensor in the compiled step
SCALARS = (
    "lr",
    "momentum",
    "one_minus_momentum",
    "decay_lr",
    "keep",
    "neg_lr",
    "coefficient",
    "raw_lr",
)


@dataclass(frozen=True)
class Layout:
    """What is fixed about a bank: its parameters' shape and dtype, their head-pair rows (0:
    not split), the state's dtype and the LR factor of the shape (`optim.muon.lr_scale`)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    head_rows: int
    state_dtype: torch.dtype
    scale: float

    def pieces(self, x: Tensor) -> list[Tensor]:
        """The matrices of a stack `x` (k, *shape) as Muon sees them: with head rows, the
        W_q, W_k blocks (k, 2·d/rows, rows, d) and W_v, W_o (k, 2, d, d); else `x`."""
        if not self.head_rows:
            return [x]
        d = x.shape[-1]
        return [x[:, :2].reshape(x.shape[0], -1, self.head_rows, d), x[:, 2:]]

    def merge(self, parts: list[Tensor]) -> Tensor:
        """`pieces` inverted, in the dtype of the first piece."""
        if len(parts) == 1:
            return parts[0]
        qk, vo = parts
        return torch.cat([qk.reshape(qk.shape[0], 2, *self.shape[-2:]), vo.to(qk.dtype)], dim=1)


@dataclass
class Bank:
    """One bank: its parameters (in the group's order), their positions in the group, the
    fixed `layout`, the rows [start, stop) this rank updates (all of them in one process),
    their LR factors (`optim.lr_mul`) and their stacked state."""

    params: list[Tensor]
    indices: list[int]
    layout: Layout
    start: int
    stop: int
    lr_mul: Tensor  # (stop − start,) float64 on the parameters' device
    momentum: Tensor  # (stop − start, *shape)
    moments: list[Tensor]  # NorMuon: one (stop − start, *moment shape) per piece; [] without
    mantissa: Tensor | None  # the master's low halves, int16; None without a master

    @property
    def mine(self) -> list[Tensor]:
        """The parameters whose rows this rank updates."""
        return self.params[self.start : self.stop]


def state_keys(bank: Bank) -> list[tuple[str, Tensor]]:
    """(per-parameter state key, the stack it is a row of), as the per-parameter path names
    them (optim/muon/optimizer.py)."""
    keys = [("momentum_buffer", bank.momentum)]
    keys += [("second_moment" + (f"_{k}" if k else ""), m) for k, m in enumerate(bank.moments)]
    if bank.mantissa is not None:
        keys.append(("mantissa", bank.mantissa))
    return keys


def make_banks(params: Sequence[Tensor], hp: MuonConfig, state_dtype: torch.dtype | None,
               world: int = 1, rank: int = 0) -> list[Bank]:  # fmt: skip
    """The banks of one param group's `params`, with zero state (a fresh optimizer's) for the
    rows rank `rank` of `world` updates: ⌈k/W⌉ consecutive matrices of each bank of k
    (optim/shards.py's cut)."""
    by_key: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        by_key.setdefault((tuple(p.shape), p.dtype, head_rows(p)), []).append(i)
    banks = []
    for (shape, dtype, rows_of_head), indices in by_key.items():
        rows = cut(len(indices), 1, world, rank)
        sdtype = state_dtype or dtype
        scale = lr_scale_factor(shape[-2:], hp.lr_scale)
        layout = Layout(shape, dtype, rows_of_head, sdtype, scale)
        device = params[indices[0]].device
        k = rows.mine
        momentum = torch.zeros((k, *shape), dtype=sdtype, device=device)
        moments = []
        if hp.normuon_beta2:
            for piece in layout.pieces(torch.empty((1, *shape), device="meta")):
                dim = stat_dim(piece.shape, hp.normuon_axis)
                moments.append(torch.zeros(moment_shape((k, *piece.shape[1:]), dim),
                                           dtype=sdtype, device=device))  # fmt: skip
        mantissa = None
        if hp.master_weights != "none":
            mantissa = torch.zeros((k, *shape), dtype=torch.int16, device=device)
        mine = indices[rows.start : rows.stop]
        lr_mul = torch.tensor([float(getattr(params[i], "lr_mul", 1.0)) for i in mine],
                              dtype=torch.float64, device=device)  # fmt: skip
        banks.append(Bank([params[i] for i in indices], indices, layout, rows.start, rows.stop,
                          lr_mul, momentum, moments, mantissa))  # fmt: skip
    return banks


def host_values(group: dict[str, Any], hp: MuonConfig, dtype: torch.dtype) -> dict[str, float]:
    """The step's values for a bank of `dtype` parameters, each computed as the
    per-parameter path computes it (Python floats, IEEE double): the momentum and 1 − μ, the
    LR (rounded to bf16 first for a bf16 matrix without a master, as `apply_update` does),
    λ·η, 1 − η·λ, −η, and record C's decay coefficient bf16(λ·η)."""
    lr, decay, mu = group["lr"], group["weight_decay"], group["momentum"]
    plain_lr = lr
    if hp.master_weights == "none" and dtype == torch.bfloat16:
        plain_lr = torch.tensor(lr, dtype=torch.bfloat16).item()
    coefficient = 0.0
    if hp.normuon_form == "o_dtype" and decay:
        coefficient = torch.tensor(decay * lr, dtype=dtype).item()  # update.decay_coefficient
    if hp.master_weights != "none":
        return {"lr": lr, "momentum": mu, "one_minus_momentum": 1 - mu, "decay_lr": decay * lr,
                "keep": 1 - lr * decay, "neg_lr": -lr, "coefficient": coefficient,
                "raw_lr": lr}  # fmt: skip
    if in_place(hp):  # `apply_in_place`'s λη, rounded to a bf16 weight's dtype
        decay_lr = in_place_factors(lr, decay, 0.0, dtype)[0]
        return {"lr": lr, "momentum": mu, "one_minus_momentum": 1 - mu, "decay_lr": decay_lr,
                "keep": 1.0, "neg_lr": -lr, "coefficient": coefficient,
                "raw_lr": lr}  # fmt: skip
    return {"lr": plain_lr, "momentum": mu, "one_minus_momentum": 1 - mu,
            "decay_lr": decay * plain_lr, "keep": 1 - plain_lr * decay, "neg_lr": -plain_lr,
            "coefficient": coefficient, "raw_lr": lr}  # fmt: skip


def in_place(hp: MuonConfig) -> bool:
    """Whether the weights take `apply_in_place`'s step (update.py)."""
    return (
        hp.master_weights == "none"
        and hp.weight_decay_form == "cautious"
        and hp.normuon_form == "fp32_mean_squares"
    )


@dataclass(frozen=True)
class Settings:
    """What `group_update` is specialised to: the Muon settings it reads and the
    Newton–Schulz dtype."""

    hp: MuonConfig
    ns_dtype: torch.dtype


def group_update(
    settings: Settings,
    layouts: tuple[Layout, ...],
    grads: list[Tensor],
    weights: list[Tensor],
    momenta: list[Tensor],
    moments: list[list[Tensor]],
    mantissas: list[Tensor | None],
    lr_muls: list[Tensor],
    scalars: list[dict[str, Tensor]],
) -> list[Tensor]:
    """One Muon step of the rows of each bank (see the module docstring): `grads[b]` and
    `weights[b]` are bank b's stacked gradients and weights (k, *shape), `scalars[b]` its
    step values (`host_values`, as 0-d float64 tensors); the state stacks are updated in
    place, and the new weights are returned, stacked, in the weights' dtype. Every list has
    one entry per bank of `layouts`."""
    hp = settings.hp
    updates = []
    for g, buf, values in zip(grads, momenta, scalars, strict=True):
        g = g.to(buf.dtype)
        mu = values["momentum"].to(buf.dtype)
        if hp.momentum_form == "ema":
            # ATen lerps a bf16 tensor with a float weight in fp32, rounding once: so here
            # (a bf16 weight would round 1 − μ to bf16 first)
            wide = torch.promote_types(buf.dtype, torch.float32)
            weight = values["one_minus_momentum"].to(wide)
            buf.copy_(torch.lerp(buf.to(wide), g.to(wide), weight))
        else:
            buf.mul_(mu).add_(g)
        if not hp.nesterov:
            updates.append(buf)
        elif hp.momentum_form == "ema":
            wide = torch.promote_types(buf.dtype, torch.float32)
            mixed = torch.lerp(g.to(wide), buf.to(wide), values["momentum"].to(wide))
            updates.append(mixed.to(buf.dtype))
        else:
            updates.append(g + buf * mu)
    pieces = [layout.pieces(u) for layout, u in zip(layouts, updates, strict=True)]
    flat = orthogonalise_stacks([p for ps in pieces for p in ps], hp, settings.ns_dtype)
    out = []
    for b, layout in enumerate(layouts):
        parts = [flat.pop(0) for _ in pieces[b]]
        if hp.normuon_beta2:
            parts = [
                normalise(o, v, hp.normuon_beta2, stat_dim(o.shape, hp.normuon_axis),
                          hp.normuon_form)
                for o, v in zip(parts, moments[b], strict=True)
            ]  # fmt: skip
        update = layout.merge(parts)
        values = scalars[b]
        step = ((values["lr"] * layout.scale) * lr_muls[b]).view(-1, *[1] * len(layout.shape))
        if mantissas[b] is not None:
            out.append(_to_master(weights[b], mantissas[b], update, step, values, hp))
        elif in_place(hp):
            out.append(_in_place(weights[b], update, step, values))
        else:
            out.append(_to_weights(weights[b], update, layout, lr_muls[b], values, hp))
    return out


def orthogonalise_stacks(stacks: list[Tensor], hp: MuonConfig, dtype: torch.dtype) -> list[Tensor]:
    """Newton–Schulz of every matrix of every stack (..., m, n), batched by shape over the
    stacks as `orthogonalise` batches a group's matrices: tall matrices join the batch of
    their wide shape (in the records' forms they stay tall, and a lone matrix goes in 2-D).
    Returns `dtype` stacks in the inputs' shapes."""
    as_given = hp.ns_form in RECORD_FORMS
    mats = [s.reshape(-1, *s.shape[-2:]) for s in stacks]
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, m in enumerate(mats):
        key = tuple(m.shape[-2:]) if as_given else tuple(sorted(m.shape[-2:]))
        by_shape.setdefault(key, []).append(i)  # type: ignore[arg-type]
    chosen = coefficient_set(hp.ns_coefficients)
    iterations = ns_coefficients(hp.ns_coefficients, hp.ns_steps)
    out: list[Tensor | None] = [None] * len(stacks)
    for members in by_shape.values():
        wide = [mats[i] if as_given or not _tall(mats[i]) else mats[i].mT for i in members]
        X = torch.cat([w.to(dtype) for w in wide]) if len(wide) > 1 else wide[0].to(dtype)
        X = X.contiguous() if not as_given else X
        lone = as_given and X.shape[0] == 1
        Y = zeropower(X[0] if lone else X, iterations, hp.eps, chosen.norm_scale, dtype,
                      hp.ns_form)  # fmt: skip
        Y = Y.reshape(-1, *wide[0].shape[-2:])
        start = 0
        for i in members:
            n = mats[i].shape[0]
            y = Y[start : start + n]
            start += n
            y = y if as_given or not _tall(mats[i]) else y.mT
            out[i] = y.reshape(stacks[i].shape)
    return out  # type: ignore[return-value]  # every stack is in exactly one batch


def _tall(m: Tensor) -> bool:
    return m.shape[-2] > m.shape[-1]


def _to_master(w: Tensor, mantissa: Tensor, update: Tensor, step: Tensor,
               scalars: dict[str, Tensor], hp: MuonConfig) -> Tensor:  # fmt: skip
    """`apply_to_master` on a stack: the fp32 masters (weights ‖ low halves) take the step,
    the low halves are stored in place and the truncated weights returned."""
    master = master_of(w, mantissa)
    step = step.to(master.dtype)
    o = update.to(master.dtype)
    if hp.weight_decay_form == "cautious":
        agree = (o * master >= 0).to(master.dtype)
        decay = scalars["decay_lr"].to(master.dtype)
        master = master - master * agree * decay * step - o * step
    else:
        master = master * scalars["keep"].to(master.dtype) - o * step
    bits = master.view(torch.int32)
    low = bits & 0xFFFF
    mantissa.copy_((low - ((low & 0x8000) << 1)).to(torch.int16))
    return truncate(master)


def _in_place(w: Tensor, update: Tensor, step: Tensor, scalars: dict[str, Tensor]) -> Tensor:
    """`apply_in_place` on a stack: W − (W⊙M)·λη·η' − O·η' with each op in float32 (the
    opmath of a bf16 or fp32 weight) rounded to the weight's dtype, as ATen's ops round;
    η' (`step`, float64 per row) rounded to a bf16 weight's dtype first, then to the opmath's."""
    dtype, wide = w.dtype, torch.promote_types(w.dtype, torch.float32)
    step = (step.to(dtype) if dtype == torch.bfloat16 else step).to(wide)
    decay = scalars["decay_lr"].to(wide)
    o = update.to(dtype)

    def rounded(x: Tensor) -> Tensor:
        return x.to(dtype).to(wide)

    agree = (rounded(o.to(wide) * w.to(wide)) >= 0).to(dtype)

    t = rounded(rounded(rounded(w.to(wide) * agree.to(wide)) * decay) * step)
    return (rounded(w.to(wide) - t) - rounded(o.to(wide) * step)).to(dtype)


def _to_weights(w: Tensor, update: Tensor, layout: Layout, lr_mul: Tensor,
                scalars: dict[str, Tensor], hp: MuonConfig) -> Tensor:  # fmt: skip
    """`apply_update` on a stack: weight decay as `hp` says, then the orthogonal step
    −η·scale·m·O. Each op is written in float32 (the opmath of a bf16 or fp32 weight) and
    rounded to the dtype the per-parameter path's op rounds to, so that both backends
    compute what ATen computes there."""
    dtype, wide = w.dtype, torch.promote_types(w.dtype, torch.float32)
    update = update.contiguous()
    if hp.weight_decay_form == "cautious" and hp.weight_decay:
        if hp.normuon_form == "o_dtype":
            u_wide = torch.promote_types(torch.promote_types(update.dtype, dtype), wide)
            agree = (update * w >= 0).to(u_wide)
            coefficient = scalars["coefficient"].to(u_wide)
            update = (update.to(u_wide) + (coefficient * agree) * w.to(u_wide)).to(update.dtype)
        else:
            agree = (update * w >= 0).to(dtype)
            decayed = (scalars["decay_lr"].to(wide) * agree.to(wide)).to(dtype)
            decayed = (decayed.to(wide) * w.to(wide)).to(dtype)
            update = (update.to(dtype).to(wide) + decayed.to(wide)).to(dtype)
    elif hp.weight_decay_form != "cautious":
        w = (w.to(wide) * scalars["keep"].to(wide)).to(dtype)
    alpha = ((scalars["neg_lr"] * layout.scale) * lr_mul).to(wide)
    alpha = alpha.view(-1, *[1] * len(layout.shape))
    return (w.to(wide) + update.to(wide) * alpha).to(dtype)


def compiled(backend: str | None) -> Callable[..., list[Tensor]]:
    """`group_update`, compiled with `backend` (static shapes, one graph) or as it is."""
    if backend is None:
        return group_update
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(group_update, dynamic=False, fullgraph=True, backend=backend,
                         options=options)  # fmt: skip


def scalar_tensors() -> dict[str, Tensor]:
    """The 0-d float64 CPU tensors `group_update` reads its step values from (CPU scalars
    enter a GPU kernel as arguments: no copy, no sync)."""
    return {k: torch.zeros((), dtype=torch.float64) for k in SCALARS}


def fill(tensors: dict[str, Tensor], values: dict[str, float]) -> None:
    for key, value in values.items():
        tensors[key].fill_(value)
