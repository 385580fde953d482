"""Adam's update, one function over lists of tensors (`adam_update`): eager, or compiled with
`torch.compile` (`optim.compile`), where inductor fuses each tensor's chain into one pass
(record_2026_07_17's 30 Adam tensors: some 300 kernel launches and 17 passes over its 415M values
eager, one pass each compiled).

Per tensor, with its settings fixed for the run (`TensorSettings`: β₁, β₂, ε, which of the
forms) and three values that change from update to update (`host_values`: the step size, the
decay coefficient and √(1 − β₂ᵗ), computed on the host):

    m ← β₁·m + (1 − β₁)·g;   v ← β₂·v + (1 − β₂)·g²
    raw ε:        u = m/(√v + ε) · η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)
    corrected ε:  u = m/(√v/√(1 − β₂ᵗ) + ε) · η/(1 − β₁ᵗ)
    cautious:     p ← p − u − λη²·1[u⊙p > 0]⊙p      (fp32, rounded once to p's dtype)
    decoupled:    p ← p·(1 − ηλ) − u

Eager, the values are Python numbers and each line is the ATen op written here, in the
state's dtype, rounding where that op rounds (`add_(g, alpha=)` and `addcdiv_(value=)` one
rounding each): the arithmetic optim/adam.py's docstring states. Compiled, the values are
0-d float64 tensors, so that nothing recompiles as they change; the two ops that take only a
number are then written out as a product and a sum, and inductor fuses and may contract the
rest. Compiled and eager Adam agree to a few fp32 roundings of the moments and, where one
crosses a bf16 weight's rounding boundary, one bf16 unit of the weight
(tests/unit/test_optimizer_compile.py; docs/optimizer-speed.md).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

Value = float | Tensor  # a Python number eager, a 0-d float64 tensor compiled


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
    decay `decay` (both already × its row's factors): η·√(1−β₂ᵗ)/(1−β₁ᵗ) (raw ε) or
    η/(1−β₁ᵗ) (corrected), and λη² (cautious) or 1 − ηλ."""
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
    values: list[list[Value]] | list[tuple[Value, ...]],
) -> None:
    """The update of every tensor of `params` (in place, their moments too): `values[i]` are
    tensor i's (step size, decay coefficient, √(1 − β₂ᵗ))."""
    for s, p, g, m, v, vals in zip(settings, params, grads, exp_avgs, exp_avg_sqs, values,
                                   strict=True):  # fmt: skip
        step, decay, root = vals
        if isinstance(step, Tensor):  # compiled: g in the dtype ATen's ops compute in (exact);
            # inductor would otherwise round addcmul's g·g to g's dtype first, a bf16 pass
            g = g.to(torch.promote_types(torch.promote_types(m.dtype, g.dtype), torch.float32))
        m.mul_(s.beta1).add_(g, alpha=1 - s.beta1)
        v.mul_(s.beta2).addcmul_(g, g, value=1 - s.beta2)
        if s.cautious:  # u and the decay in fp32 from the moments, rounded once on store
            wide = torch.promote_types(p.dtype, torch.float32)  # fp32, or float64 in tests
            mw, vw = m.to(wide), v.to(wide)
            sq = vw.sqrt()
            u = mw.div((sq if s.raw_eps else sq / root).add_(s.eps)).mul_(step)
            w = p.to(wide)
            mask = (u * w) > 0  # strict: where u or p is 0 nothing decays (record_2026_07_17, #53)
            p.copy_(w.sub(u).sub_(w * mask * decay))
            continue
        if s.decays:
            p.mul_(decay)
        if s.raw_eps:
            p.add_(m.div(v.sqrt().add_(s.eps)).mul_(step), alpha=-1.0)
        else:
            _add_quotient(p, m, (v.sqrt() / root).add_(s.eps), step)


def _add_quotient(p: Tensor, m: Tensor, denom: Tensor, step: Value) -> None:
    """p ← p − step·m/denom: ATen's `addcdiv_` (one rounding) for a number; written out for a
    0-d tensor, which `addcdiv_` does not take as its factor."""
    if isinstance(step, Tensor):
        p.copy_(p + (-step * m) / denom)
    else:
        p.addcdiv_(m, denom, value=-step)


def compiled(backend: str | None) -> Callable[..., None]:
    """`adam_update`, compiled with `backend` (static shapes, one graph) or as it is."""
    if backend is None:
        return adam_update
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(adam_update, dynamic=False, fullgraph=True, backend=backend,
                         options=options)  # fmt: skip
