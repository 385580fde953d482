"""The matrices Muon sees in a parameter, and NorMuon's normalisation of each.

Matrices (`optim.muon.qk_split`): a parameter is its own matrix (or a stack of them), except a
(4, d, d) W_q, W_k, W_v, W_o stack marked with `head_rows` = 2·head_dim (qk_split=head_pairs,
the 2026-07 record's #80): W_q and W_k become blocks of 2·head_dim rows, the rows of heads
(0, 1), (2, 3), ..., each orthogonalised and normalised on its own; W_v and W_o stay whole.

NorMuon (`normuon_beta2` > 0), per matrix O with second-moment buffer V and β₂:

    r = mean(O², dim)              dim −2 (per column) for normuon_axis=columns; for shape,
                                   −1 (per row) where rows ≥ cols, else −2; −1 for rows
    V ← β₂·V + (1 − β₂)·r          (no bias correction)
    Ô = O/√max(V, 1e-10) · ‖O‖_F / max(‖O/√max(V, 1e-10)‖_F, 1e-10)

`normuon_form` says in which precision (optim/config.py): fp32 computes it in V's dtype;
o_dtype keeps O in its own (bf16) dtype through each step, as the 2025-11 record's script does
in place on its bf16 O; fp32_mean_squares takes both norms from r in fp32 (‖O‖² = n·Σr,
‖O/√V‖² = n·Σ r/V, n the length of `dim`) and rounds the factor ρ to O's dtype, Ô = O·ρ.
"""

import torch
from torch import Tensor

NORMUON_FLOOR = 1e-10  # the floor under the second moment and the norm, as the records'
QKVO = "attn.qkvo"  # the name a (4, d, d) W_q, W_k, W_v, W_o stack ends with


def head_rows(p: Tensor) -> int:
    """The rows of one head-pair block of `p`, 0 where `p` is not split."""
    return getattr(p, "muon_head_rows", 0)


def mark_head_pairs(model: torch.nn.Module, named: list[tuple[str, Tensor]], split: str) -> None:
    """Mark Muon's parameters with their head-pair rows (`muon_head_rows`): 2·head_dim on each
    (4, d, d) W_q, W_k, W_v, W_o stack with qk_split=head_pairs, 0 on every other."""
    stacks = 0
    for name, p in named:
        rows = 0
        if split == "head_pairs" and name.endswith(QKVO):
            attn = model.get_submodule(name.removesuffix(".qkvo"))
            if attn.n_head % 2:
                raise ValueError(
                    f"optim.muon.qk_split=head_pairs needs an even model.n_head, got {attn.n_head}"
                )
            rows, stacks = 2 * attn.head_dim, stacks + 1
        p.muon_head_rows = rows  # type: ignore[attr-defined]
    if split == "head_pairs" and not stacks:
        raise ValueError(
            "optim.muon.qk_split=head_pairs needs the (4, d, d) W_q, W_k, W_v, W_o stacks of "
            "model.attention.merged_qkvo=true; no Muon parameter is one"
        )


def pieces(x: Tensor, rows: int) -> list[Tensor]:
    """The matrices of `x` ((4, d, d), or a stack (k, 4, d, d) of them) taken on their own: with
    `rows`, W_q and W_k as one stack of (rows, d) blocks and W_v, W_o as (2, d, d), each
    behind x's leading dims; else `x` itself."""
    if not rows:
        return [x]
    lead = x.shape[:-3]
    return [x[..., :2, :, :].reshape(*lead, -1, rows, x.shape[-1]), x[..., 2:, :, :]]


def merge(parts: list[Tensor], shape: torch.Size | tuple[int, ...]) -> Tensor:
    """`pieces` inverted: the tensor of `shape` the parts came from, in the first's dtype."""
    if len(parts) == 1:
        return parts[0]
    qk, vo = parts
    return torch.cat([qk.reshape(*shape[:-3], 2, *shape[-2:]), vo.to(qk.dtype)], dim=-3)


def stat_dim(shape: torch.Size | tuple[int, ...], axis: str) -> int:
    """The dim NorMuon's mean squares reduce over (module docstring)."""
    if axis == "columns":
        return -2
    if axis == "rows":
        return -1
    return -1 if shape[-2] >= shape[-1] else -2


def moment_shape(shape: torch.Size | tuple[int, ...], dim: int) -> tuple[int, ...]:
    """The second moment's shape for a matrix (stack) of `shape` reduced over `dim`."""
    out = list(shape)
    out[dim] = 1
    return tuple(out)


def normalise(o: Tensor, second_moment: Tensor, beta2: float, dim: int, form: str) -> Tensor:
    """NorMuon's step on a whole orthogonalised update `o` (a matrix or a stack), updating
    `second_moment` (`moment_shape`) in place; returns V's dtype (fp32 form) or `o`'s."""
    if form == "fp32":
        # Contiguous: a tall matrix's update arrives as a transposed view in one process and
        # as a contiguous copy from an exchange, and a reduction's order (its rounding)
        # follows the layout; one layout keeps every strategy bitwise equal.
        o = o.to(second_moment.dtype).contiguous()
        norm = o.norm(dim=(-2, -1), keepdim=True)
        second_moment.lerp_(o.square().mean(dim=dim, keepdim=True), 1 - beta2)
        o = o / second_moment.clamp_min(NORMUON_FLOOR).sqrt()
        return o * (norm / o.norm(dim=(-2, -1), keepdim=True).clamp_min(NORMUON_FLOOR))
    o = o.contiguous()
    if form == "o_dtype":
        # Each step rounds to O's dtype, as the record's in-place ops on its bf16 O do.
        norm = o.norm(dim=(-2, -1), keepdim=True)
        second_moment.lerp_((o * o).mean(dim=dim, keepdim=True).to(second_moment.dtype), 1 - beta2)
        o = (o / second_moment.clamp_min(NORMUON_FLOOR).sqrt()).to(o.dtype)
        return (o * (norm / o.norm(dim=(-2, -1), keepdim=True).clamp_min(NORMUON_FLOOR))).to(
            o.dtype
        )
    # fp32_mean_squares: the mean squares in fp32 (or wider), both norms from them.
    wide = o.to(torch.promote_types(o.dtype, torch.float32))
    r = wide.square().mean(dim=dim, keepdim=True)
    sums = r * o.shape[dim]  # the squared norm of each row (column) of O
    norm = sums.sum(dim=(-2, -1), keepdim=True).sqrt()
    second_moment.lerp_(r.to(second_moment.dtype), 1 - beta2)
    step = second_moment.clamp_min(NORMUON_FLOOR).rsqrt().to(wide.dtype)
    scaled = (sums * step.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
    rho = step * (norm / scaled.clamp_min(NORMUON_FLOOR))
    return o * rho.to(o.dtype)
