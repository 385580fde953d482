"""Adam's due updates as one function of lists of tensors, for `torch.compile` (`optim.compile`).

optim/adam.py steps one tensor at a time, about ten ATen ops each, so record D's 30 Adam
tensors cost some 300 kernel launches and, for its 415M values, about 17 passes over memory
per update. `adam_update` is the same update for every tensor due at once, written as one
function of lists: compiled, inductor fuses each tensor's chain into one pass.

Per tensor, with its settings fixed for the run (`TensorSettings`: β₁, β₂, ε, which of the
forms) and two values that change from update to update (`host_values`: the step size and
the decay coefficient, computed on the host exactly as optim/adam.py computes them, fed as 0-d
float64 tensors so that nothing recompiles):

    m ← β₁·m + (1 − β₁)·g;   v ← β₂·v + ((1 − β₂)·g)·g
    raw ε:        u = m/(√v + ε) · η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)
    corrected ε:  u = m/(√v/√(1 − β₂ᵗ) + ε) · η/(1 − β₁ᵗ)
    cautious:     p ← p − u − λη²·1[u⊙p > 0]⊙p      (fp32, rounded once to p's dtype)
    decoupled:    p ← p·(1 − ηλ) − u

Every op runs in the dtype optim/adam.py's op runs in and rounds where it rounds, except that
ATen fuses two of them into one rounding (`add(g, alpha=1 − β₁)` is a fused multiply-add on a
vectorised CPU loop, `addcmul`'s product order), which written as separate ops round twice;
inductor may contract others. So compiled and uncompiled Adam agree to a few fp32 roundings
of the moments and, where such a rounding crosses a bf16 weight's rounding boundary, one
bf16 unit of the weight (tests/unit/test_optimizer_compile.py; docs/optimizer-speed.md).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class TensorSettings:
    """One tensor's fixed settings: its betas, ε, where ε enters and how it decays."""

    beta1: float
    beta2: float
    eps: float
    raw_eps: bool  # optim.adamw.eps_placement=raw
    cautious: bool  # optim.adamw.weight_decay_form=cautious
    decays: bool  # its λ (× its row's wd_mul) is nonzero


def host_values(s: TensorSettings, lr: float, decay: float, t: int) -> tuple[float, ...]:
    """(step size, decay coefficient, √(1 − β₂ᵗ)) of a tensor's t-th update at LR `lr` and
    decay `decay` (both already × its row's factors), as optim/adam.py computes them:
    η·√(1−β₂ᵗ)/(1−β₁ᵗ) (raw ε) or η/(1−β₁ᵗ) (corrected), and λη² (cautious) or 1 − ηλ."""
    bias1, bias2 = 1 - s.beta1**t, 1 - s.beta2**t
    step = lr * (bias2**0.5 / bias1) if s.raw_eps else lr / bias1
    coefficient = decay * lr * lr if s.cautious else 1 - lr * decay
    return step, coefficient, bias2**0.5


def adam_update(
    settings: tuple[TensorSettings, ...],
    params: list[Tensor],
    grads: list[Tensor],
    exp_avgs: list[Tensor],
    exp_avg_sqs: list[Tensor],
    values: list[list[Tensor]],
) -> None:
    """The update of every tensor of `params` (in place, their moments too): `values[i]` are
    tensor i's (step size, decay coefficient, √(1 − β₂ᵗ)) as 0-d float64 tensors."""
    for s, p, g, m, v, vals in zip(settings, params, grads, exp_avgs, exp_avg_sqs, values,
                                   strict=True):  # fmt: skip
        md = m.dtype
        work = _opmath(md)
        g = g.to(work)
        m.copy_((_round(m.to(work) * s.beta1, md) + g * (1 - s.beta1)).to(md))
        v.copy_((_round(v.to(work) * s.beta2, md) + (g * (1 - s.beta2)) * g).to(md))
        step, decay, root = vals
        if s.cautious:  # optim/adam.py's `_step` and `_cautious`, in fp32 from the moments
            wide = _opmath(p.dtype)
            mw, vw = m.to(wide), v.to(wide)
            sq = vw.sqrt()
            u = mw / ((sq if s.raw_eps else sq / root.to(wide)) + s.eps) * step.to(wide)
            w = p.to(wide)
            mask = (u * w) > 0
            p.copy_((w - u - w * mask * decay.to(wide)).to(p.dtype))
            continue
        pd = p.dtype
        pw = _opmath(torch.promote_types(pd, md))
        w = p.to(pw)
        if s.decays:
            w = _round(w * decay.to(pw), pd)
        sq = _round(v.to(work).sqrt(), md)
        if s.raw_eps:  # p.add_(m.div(v.sqrt().add_(eps)).mul_(step), alpha=-1)
            q = _round(m.to(work) / _round(sq + s.eps, md), md)
            p.copy_((w - _round(q * step.to(work), md).to(pw)).to(pd))
        else:  # p.addcdiv_(m, (v.sqrt() / root).add_(eps), value=-step)
            denom = _round(_round(sq / root.to(work), md) + s.eps, md)
            p.copy_((w + (-step.to(pw) * m.to(pw)) / denom.to(pw)).to(pd))


def _opmath(dtype: torch.dtype) -> torch.dtype:
    """The dtype ATen computes a `dtype` op in: float32 for bf16 and fp32, else its own."""
    return torch.promote_types(dtype, torch.float32)


def _round(x: Tensor, dtype: torch.dtype) -> Tensor:
    """`x` rounded to `dtype`, back in its own (an in-place op of a `dtype` tensor)."""
    return x.to(dtype).to(x.dtype)


def compiled(backend: str | None) -> Callable[..., None]:
    """`adam_update`, compiled with `backend` (static shapes, one graph) or as it is."""
    if backend is None:
        return adam_update
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(adam_update, dynamic=False, fullgraph=True, backend=backend,
                         options=options)  # fmt: skip
