"""Muon's update arithmetic, the same whichever way a step is distributed.

For a matrix W with gradient g, momentum buffer buf, and its param group's momentum μ, LR η
and weight decay, and the settings `hp` (`MuonConfig`):

    advance_momentum:  buf ← lerp(buf, g, 1 − μ)            (ema)  |  buf ← μ·buf + g  (accumulate)
    momentum_update:   u = lerp(g, buf, μ) | g + μ·buf      (Nesterov; buf itself without)
    (Newton–Schulz:    O ≈ U·Vᵀ of u, optim/muon/newton_schulz.py)
    normalise_columns: O ← O / √max(V, 1e-10) per column, V ← β₂·V + (1 − β₂)·mean_rows(O²),
                       then O ← O·‖O₀‖_F / max(‖O‖_F, 1e-10)    (NorMuon; normuon_beta2 > 0)
    apply_update:      W ← W·(1 − η·λ) − η·m·scale(shape)·O            (decoupled weight decay)
                       W ← W − η·m·scale(shape)·(O + λ·η·[O⊙W ≥ 0]⊙W)  (cautious)
                       with m the parameter's LR multiplier (`optim.lr_mul`, 1 by default)
                       O ← bf16(O + bf16(λη)·[O⊙W ≥ 0]⊙W)  (normuon_form=o_dtype)
    apply_to_master:   W ← W − (W⊙[O⊙W ≥ 0])·λη·η' − O·η'   (fp32 master, η' = η·m·scale)
    apply_in_place:    the same on the weight itself (normuon_form=fp32_mean_squares, no
                       master: record M), a bf16 weight's λη and η' rounded to bf16 first

The first two are elementwise, so a shard of buf and g gives that shard of the result; the
last takes the *whole* matrix's shape for its LR scale, so it applies a shard's rows alike.
"""

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from optim.config import LR_SCALES, MuonConfig
from optim.muon.normuon import normalise

# `optim.muon.lr_scale`: the factor on the LR of a (rows, cols) matrix, one per LR_SCALES name.
LR_SCALE_OF: dict[str, Callable[[int, int], float]] = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),  # Keller Jordan's
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),  # Moonshot's
    "none": lambda rows, cols: 1.0,
}


def lr_scale_factor(shape: Sequence[int], lr_scale: str) -> float:
    """The factor multiplying the LR of a matrix of `shape` (rows, cols) under `lr_scale`."""
    if lr_scale not in LR_SCALE_OF:
        raise ValueError(f"lr_scale must be one of {list(LR_SCALES)}, got {lr_scale!r}")
    rows, cols = shape
    return LR_SCALE_OF[lr_scale](rows, cols)


def advance_momentum(buf: Tensor, g: Tensor, group: dict[str, Any], hp: MuonConfig) -> None:
    """`buf` takes gradient `g` in place, at the group's current momentum."""
    if hp.momentum_form == "ema":
        buf.lerp_(g, 1 - group["momentum"])
    else:
        buf.mul_(group["momentum"]).add_(g)


def momentum_update(buf: Tensor, g: Tensor, group: dict[str, Any], hp: MuonConfig) -> Tensor:
    """The update to orthogonalise, after `advance_momentum`: the buffer itself without
    Nesterov (later phases only read it), else the look-ahead mix of `g` and `buf`."""
    if not hp.nesterov:
        return buf
    m = group["momentum"]
    return g.lerp(buf, m) if hp.momentum_form == "ema" else g.add(buf, alpha=m)


def normalise_columns(o: Tensor, second_moment: Tensor, beta2: float) -> Tensor:
    """NorMuon's step per column (the 2025-11 record's axis) in fp32: optim/muon/normuon.py."""
    return normalise(o, second_moment, beta2, -2, "fp32")


def decay_coefficient(decay: float, lr: float, dtype: torch.dtype) -> float:
    """λ·η rounded once to `dtype` (normuon_form=o_dtype): for the 2025-11 record's bf16 gates
    bf16(1.2·η), where rounding η first, bf16(1.2·bf16(η)), differs in the last bit at 541 of
    its 2,160 steps."""
    return torch.tensor(decay * lr, dtype=dtype).item()


def apply_update(
    p: Tensor,
    update: Tensor,
    group: dict[str, Any],
    hp: MuonConfig,
    shape: Sequence[int],
    lr_mul: float = 1.0,
) -> None:
    """Weight decay (`hp.weight_decay_form`), then the orthogonal step scaled for a whole
    matrix of `shape` and by the parameter's `lr_mul` (`optim.lr_mul`), on `p` (the matrix,
    or this rank's rows of it). A bf16 matrix takes its step in bf16, the LR η rounded to
    bf16 first (the 2025-11 record's gates: 0.023 → 0.02294921875)."""
    if hp.weight_decay_form == "cautious" and hp.normuon_form == "fp32_mean_squares":
        apply_in_place(p, update, group, hp, shape, lr_mul)
        return
    lr, decay = group["lr"], group["weight_decay"]
    if p.dtype == torch.bfloat16:
        lr = torch.tensor(lr, dtype=torch.bfloat16).item()
    # A tall matrix's update is a transposed view; adding it to a row-major parameter walks
    # memory column-wise, 2-3x slower on a CPU than transposing it first.
    update = update.contiguous()
    if hp.weight_decay_form == "cautious":
        if decay and hp.normuon_form == "o_dtype":
            # The record adds the decay into its bf16 O in place (fp32 arithmetic, one
            # rounding to O's dtype), with the coefficient λ·η rounded once to W's dtype.
            coefficient = decay_coefficient(decay, group["lr"], p.dtype)
            wide = torch.promote_types(torch.promote_types(update.dtype, p.dtype), torch.float32)
            agree = (update * p >= 0).to(wide)
            update = (update.to(wide) + (coefficient * agree) * p.to(wide)).to(update.dtype)
        elif decay:
            agree = (update * p >= 0).to(p.dtype)
            update = update.to(p.dtype) + (decay * lr) * agree * p
    else:
        p.mul_(1 - lr * decay)
    p.add_(update, alpha=-lr * lr_scale_factor(shape[-2:], hp.lr_scale) * lr_mul)


def in_place_factors(
    lr: float, decay: float, step: float, dtype: torch.dtype
) -> tuple[float, float]:
    """(λη, η'), the two factors of `apply_in_place`: IEEE doubles, each rounded once to a bf16
    weight's dtype (record M's gates: "both factors are rounded to bf16")."""
    decay_lr = decay * lr
    if dtype == torch.bfloat16:
        return tuple(torch.tensor([decay_lr, step], dtype=dtype).tolist())  # type: ignore[return-value]
    return decay_lr, step


def apply_in_place(
    p: Tensor,
    update: Tensor,
    group: dict[str, Any],
    hp: MuonConfig,
    shape: Sequence[int],
    lr_mul: float = 1.0,
) -> None:
    """normuon_form=fp32_mean_squares without a master (record M, "as D.3 step 5 on the
    parameter itself"): `apply_to_master`'s order on the weight, W ← W − (W⊙M)·λη·η' − O·η',
    M = [O⊙W ≥ 0], η' = η·scale(shape)·m, each product rounded to the weight's dtype as it
    comes; a bf16 weight's λη and η' rounded to bf16 first (`in_place_factors`)."""
    step = group["lr"] * lr_scale_factor(shape[-2:], hp.lr_scale) * lr_mul
    decay_lr, step = in_place_factors(group["lr"], group["weight_decay"], step, p.dtype)
    o = update.to(p.dtype)
    agree = (o * p >= 0).to(p.dtype)
    p.copy_(p - p * agree * decay_lr * step - o * step)


def apply_to_master(
    master: Tensor,
    update: Tensor,
    group: dict[str, Any],
    hp: MuonConfig,
    shape: Sequence[int],
    lr_mul: float = 1.0,
) -> None:
    """The step on an fp32 `master` (optim/muon/master.py), in the 2026-07 record's order:
    W ← W − (W⊙M)·λη·η' − O·η', M = [O⊙W ≥ 0], η' = η·m·scale(shape), each product rounded
    to fp32 as it comes (decoupled decay: W ← W·(1 − ηλ) − O·η')."""
    lr, decay = group["lr"], group["weight_decay"]
    step = lr * lr_scale_factor(shape[-2:], hp.lr_scale) * lr_mul
    o = update.to(master.dtype)
    if hp.weight_decay_form == "cautious":
        agree = (o * master >= 0).to(master.dtype)
        master.copy_(master - master * agree * (decay * lr) * step - o * step)
    else:
        master.mul_(1 - lr * decay).sub_(o * step)
