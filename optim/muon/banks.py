"""Muon's banks: a param group's matrices of one shape stacked, with their state stacked too
(`optim.compile`; `dist.parallelism=ddp_row_shards` shares the banks out by rows).

A bank is every parameter of a Muon param group with the same shape, dtype and head-pair
split, in the group's order (record_2026_07_17: the ten (4, 768, 768) W_q, W_k, W_v, W_o stacks, and
the 22 MLP matrices, C_fc and C_proj alike, 3,072 × 768). Its state is stacked too: the
momentum (k, *shape), NorMuon's second moments (one stack per kind of piece: the head-pair
blocks, then W_v and W_o) and the fp32 master's low halves. Each parameter's entries in the
optimizer's state are views of those stacks (row j of each), so `state_dict()`, the
checkpoints and Distributed Checkpoint see the per-parameter state they always saw, and a
checkpoint moves freely between the banked and the per-parameter step.

A bank is stepped by Muon's one update (optim/muon/update.py `stack_update`), compiled: its
values as 0-d float64 tensors and a factor per row, so one graph serves the run. Eager, the
per-parameter step runs the same function on each matrix as a stack of one with Python
floats; the two differ only where ATen fuses a multiply and an add into one rounding
(update.py), and are bit for bit the same for record_2026_07_17 and record_medium_2025_12_31
(tests/unit/test_optimizer_compile.py).
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from optim.config import MuonConfig
from optim.ddp_rows import cut
from optim.muon.normuon import head_rows, moment_shape, stat_dim
from optim.muon.update import Layout


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
    (optim/ddp_rows.py's cut)."""
    by_key: dict[tuple, list[int]] = {}
    for i, p in enumerate(params):
        by_key.setdefault((tuple(p.shape), p.dtype, head_rows(p)), []).append(i)
    banks = []
    for (shape, _, _), indices in by_key.items():
        rows = cut(len(indices), 1, world, rank)
        layout = Layout.of(params[indices[0]], hp, state_dtype)
        sdtype = layout.state_dtype
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
