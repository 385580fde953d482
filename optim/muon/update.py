"""Muon's update of a stack of matrices: one function for every layout and every way it runs.

The unit is a stack (k, *shape) of matrices of one shape, dtype and head-pair split (`Layout`):
a parameter on its own is a stack of one (optim/muon/optimizer.py), a bank is a param group's
matrices of one shape (optim/muon/banks.py). For a stack W with gradient G, momentum buffer B,
the group's momentum μ, LR η and weight decay λ, each matrix's LR multiplier m
(`optim.lr_mul`), the shape's LR scale s (`optim.muon.lr_scale`) and the settings `hp`:

    momentum   B ← lerp(B, G, 1 − μ)  (ema)  |  B ← μ·B + G  (accumulate), G ← G + λ·W
               first where the decay is coupled (L2)
               U = lerp(G, B, μ)  |  G + μ·B  with Nesterov; B itself without
    (Newton–Schulz: O ≈ U·Vᵀ of each piece, optim/muon/newton_schulz.py `orthogonalise`)
    finish     NorMuon on each piece with its own second moments (normuon.py), then
               decoupled:  W ← W·(1 − ηλ) − η·m·s·O
               cautious:   W ← W − η·m·s·(O + λη·[O⊙W ≥ 0]⊙W); normuon_form=o_dtype adds the
                           decay into O in O's dtype, with λη rounded once to W's dtype
               in place:   W ← W − (W⊙M)·λη·η' − O·η', M = [O⊙W ≥ 0], η' = η·m·s
                           (fp32_mean_squares without a master: record_medium_2025_12_31;
                           a bf16 weight's λη
                           and η' rounded to bf16 first)
               a master:   the same order (or W·(1 − ηλ) − O·η') on the fp32 master of a bf16
                           weight (master.py), which then splits into weight and low half

`momentum` and `finish` are the phases either side of Newton–Schulz, apart so that an exchange
can sit between them (optim/muon/strategies.py, fsdp_strategies.py); `stack_update` runs all three
for a list of stacks. How they are called is all that differs:

- eager, with the step values as Python floats (`host_values`) and one m per stack: each op
  is ATen's op with a scalar, a bf16 lerp rounding once and `add(W, O, alpha=−η·m·s)` fusing
  its multiply and add;
- compiled (`compiled`), with the same values as 0-d float64 tensors (nothing recompiles as
  they change) and m a float64 tensor per row: there the products round first, and each op is
  written in the dtype ATen's op computes in, so that inductor computes ATen's roundings.
"""

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from optim.config import LR_SCALES, MuonConfig
from optim.muon.master import master_of, truncate
from optim.muon.newton_schulz import Chosen, orthogonalise
from optim.muon.normuon import merge, normalise, pieces, stat_dim

Value = float | Tensor  # a Python float eager, a 0-d float64 tensor compiled
# The step values (`host_values`), each a 0-d float64 tensor in the compiled step
SCALARS = ("lr", "momentum", "one_minus_momentum", "decay", "decay_lr", "keep", "neg_lr",
           "coefficient")  # fmt: skip

# `optim.muon.lr_scale`: the factor on the LR of a (rows, cols) matrix, one per LR_SCALES name.
LR_SCALE_OF: dict[str, Callable[[int, int], float]] = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),  # Keller Jordan's
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),  # Moonshot's
    "unit_rms_norm": lambda rows, cols: math.sqrt(rows / cols),  # a unit RMS→RMS norm
    "none": lambda rows, cols: 1.0,
}


def lr_scale_factor(shape: Sequence[int], lr_scale: str, extra: float = 1.0) -> float:
    """The factor multiplying the LR of a matrix of `shape` (rows, cols) under `lr_scale`,
    times `extra` (`optim.muon.extra_scale`; × 1.0 leaves every bit as it was)."""
    if lr_scale not in LR_SCALE_OF:
        raise ValueError(f"lr_scale must be one of {list(LR_SCALES)}, got {lr_scale!r}")
    rows, cols = shape
    return LR_SCALE_OF[lr_scale](rows, cols) * extra


@dataclass(frozen=True)
class Layout:
    """What is fixed about a stack: its matrices' shape and dtype, their head-pair rows (0:
    not split), the state's dtype and the LR factor of the shape (`optim.muon.lr_scale`)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    head_rows: int
    state_dtype: torch.dtype
    scale: float

    @staticmethod
    def of(p: Tensor, hp: MuonConfig, state_dtype: torch.dtype | None) -> "Layout":
        """The layout of parameter `p` (its global shape, where it is a shard)."""
        shape = tuple(p.shape)
        return Layout(shape, p.dtype, getattr(p, "muon_head_rows", 0), state_dtype or p.dtype,
                      lr_scale_factor(shape[-2:], hp.lr_scale, hp.extra_scale))  # fmt: skip

    def pieces(self, x: Tensor) -> list[Tensor]:
        """The matrices of a stack `x` (k, *shape) as Muon sees them (normuon.py `pieces`)."""
        return pieces(x, self.head_rows)

    def merge(self, parts: list[Tensor]) -> Tensor:
        """`pieces` inverted, in the dtype of the first piece."""
        return merge(parts, (parts[0].shape[0], *self.shape))


def in_place(hp: MuonConfig) -> bool:
    """Whether the weights take the in-place step (record_medium_2025_12_31's)."""
    return (
        hp.master_weights == "none"
        and hp.weight_decay_form == "cautious"
        and hp.normuon_form == "fp32_mean_squares"
    )


def _round(x: float, dtype: torch.dtype) -> float:
    """`x` rounded once to `dtype` (an IEEE double for fp32 and wider)."""
    return torch.tensor(x, dtype=dtype).item() if dtype == torch.bfloat16 else x


def host_values(group: dict[str, Any], hp: MuonConfig, dtype: torch.dtype) -> dict[str, float]:
    """The step's values for a stack of `dtype` matrices, as Python floats (IEEE doubles): μ
    and 1 − μ, the LR (rounded to bf16 first for a bf16 matrix stepped on itself, outside the
    in-place form), λ, λ·η (the in-place form's rounded to a bf16 weight's dtype), 1 − η·λ,
    −η, and record_2025_11_29's decay coefficient bf16(λ·η) (normuon_form=o_dtype)."""
    lr, decay, mu = group["lr"], group["weight_decay"], group["momentum"]
    plain = hp.master_weights == "none" and not in_place(hp)
    step_lr = _round(lr, dtype) if plain else lr
    decay_lr = _round(decay * lr, dtype) if in_place(hp) else decay * step_lr
    # λ·η rounded once to the weight's dtype: for the 2025-11 record's bf16 gates bf16(1.2·η),
    # where rounding η first, bf16(1.2·bf16(η)), differs in the last bit at 541 of 2,160 steps.
    coefficient = _round(decay * lr, dtype) if hp.normuon_form == "o_dtype" and decay else 0.0
    return {"lr": step_lr, "momentum": mu, "one_minus_momentum": 1 - mu, "decay": decay,
            "decay_lr": decay_lr, "keep": 1 - step_lr * decay, "neg_lr": -step_lr,
            "coefficient": coefficient}  # fmt: skip


def _as(x: Value, dtype: torch.dtype) -> Value:
    """A step value as a factor in an op computing in `dtype`: a tensor cast to it; a float as
    it is (ATen casts a scalar to the op's compute dtype: the same rounding)."""
    return x.to(dtype) if isinstance(x, Tensor) else x


def momentum(g: Tensor, buf: Tensor, values: dict[str, Value], hp: MuonConfig,
             look_ahead: bool = True, w: Tensor | None = None) -> Tensor | None:  # fmt: skip
    """`buf` takes gradient `g` in place (with λ·`w` added: weight_decay_form=coupled);
    returns the update to orthogonalise (`buf` itself without Nesterov), or None where it is
    not wanted (`look_ahead` false)."""
    g = g.to(buf.dtype)  # a bf16 gradient into an fp32 momentum (master_weights)
    mu, eager = values["momentum"], not isinstance(values["momentum"], Tensor)
    if hp.weight_decay_form == "coupled":
        if w is None:
            raise ValueError("weight_decay_form=coupled adds λ·W to the gradient: pass `w`")
        decay, w = values["decay"], w.to(buf.dtype)
        g = g.add(w, alpha=decay) if eager else g + w * decay.to(buf.dtype)  # type: ignore[union-attr]
    # ATen lerps a bf16 tensor with a float weight in fp32, rounding once; so does the
    # compiled form, written out
    wide = torch.promote_types(buf.dtype, torch.float32)
    if hp.momentum_form == "ema":
        if eager:
            buf.lerp_(g, values["one_minus_momentum"])
        else:
            weight = values["one_minus_momentum"].to(wide)  # type: ignore[union-attr]
            buf.copy_(torch.lerp(buf.to(wide), g.to(wide), weight))
    else:
        buf.mul_(_as(mu, buf.dtype)).add_(g)
    if not look_ahead:
        return None
    if not hp.nesterov:
        return buf
    if hp.momentum_form == "ema":
        if eager:
            return g.lerp(buf, mu)
        return torch.lerp(g.to(wide), buf.to(wide), mu.to(wide)).to(buf.dtype)  # type: ignore[union-attr]
    return g.add(buf, alpha=mu) if eager else g + buf * mu.to(buf.dtype)  # type: ignore[union-attr]


def finish(layout: Layout, w: Tensor, parts: list[Tensor], moments: Sequence[Tensor],
           mantissa: Tensor | None, lr_mul: Value, values: dict[str, Value],
           hp: MuonConfig) -> Tensor:  # fmt: skip
    """NorMuon, weight decay and the step of stack `w` (k, *shape) from the orthogonalised
    pieces of its update (`layout.pieces`). NorMuon's second moments (`moments`, one per
    piece) and a master's low halves (`mantissa`) are updated in place; returns the new
    weights in w's dtype (eager, a step on the weights themselves is taken on `w` in place and
    `w` returned). `lr_mul`: m, one float for the stack (eager) or a (k,) float64 tensor."""
    if hp.normuon_beta2:
        parts = [
            normalise(o, v, hp.normuon_beta2, stat_dim(o.shape, hp.normuon_axis), hp.normuon_form)
            for o, v in zip(parts, moments, strict=True)
        ]
    update = layout.merge(parts)
    step = (values["lr"] * layout.scale) * lr_mul  # η' = η·s·m
    if isinstance(step, Tensor):
        step = step.view(-1, *[1] * len(layout.shape))
    if mantissa is not None:
        return _to_master(w, mantissa, update, step, values, hp)
    if in_place(hp):
        return _in_place(w, update, step, values)
    return _to_weights(w, update, layout, lr_mul, values, hp)


def step_matrix(w: Tensor, update: Tensor, group: dict[str, Any], hp: MuonConfig,
                lr_mul: float = 1.0, *, shape: Sequence[int] | None = None, head_rows: int = 0,
                moments: Sequence[Tensor] = (), mantissa: Tensor | None = None,
                values: dict[str, float] | None = None) -> None:  # fmt: skip
    """`finish` of one matrix `w` in place, eager, as a stack of one: a parameter (or this
    rank's rows of one, `shape` the whole's) with its orthogonalised `update`, its NorMuon
    `moments` and its master's `mantissa`; `values` (default: `host_values` of `group`, whose
    momentum this phase does not read)."""
    shape = tuple(shape or w.shape)
    state_dtype = torch.float32 if mantissa is not None else w.dtype
    scale = lr_scale_factor(shape[-2:], hp.lr_scale, hp.extra_scale)
    layout = Layout(shape, w.dtype, head_rows, state_dtype, scale)
    new = finish(layout, w.unsqueeze(0), [x.unsqueeze(0) for x in layout.pieces(update)],
                 [m.unsqueeze(0) for m in moments],
                 None if mantissa is None else mantissa.unsqueeze(0), lr_mul,
                 values or host_values({"momentum": 0.0, **group}, hp, w.dtype), hp)  # type: ignore[arg-type]  # fmt: skip
    if new.data_ptr() != w.data_ptr():  # (the decoupled and cautious steps are in place)
        w.copy_(new[0])


def _to_master(w: Tensor, mantissa: Tensor, update: Tensor, step: Value,
               values: dict[str, Value], hp: MuonConfig) -> Tensor:  # fmt: skip
    """The step on the fp32 masters (weights ‖ low halves): the low halves are stored in
    place and the truncated weights returned. Each product rounds to fp32 as it comes."""
    master = master_of(w, mantissa)
    step = _as(step, master.dtype)
    o = update.to(master.dtype)
    if hp.weight_decay_form == "cautious":
        agree = (o * master >= 0).to(master.dtype)
        decay = _as(values["decay_lr"], master.dtype)
        master = master - master * agree * decay * step - o * step
    elif hp.weight_decay_form == "decoupled":
        master = master * _as(values["keep"], master.dtype) - o * step
    else:  # coupled: the decay is in the gradient
        master = master - o * step
    low = master.view(torch.int32) & 0xFFFF
    mantissa.copy_((low - ((low & 0x8000) << 1)).to(torch.int16))  # 0…65535 as int16
    return truncate(master)


def _in_place(w: Tensor, update: Tensor, step: Value, values: dict[str, Value]) -> Tensor:
    """W − (W⊙M)·λη·η' − O·η' on the weights, each op in float32 (the compute dtype of a
    bf16 or fp32 weight) rounded to the weight's dtype, as ATen's ops round; η' rounded to a
    bf16 weight's dtype first."""
    dtype, wide = w.dtype, torch.promote_types(w.dtype, torch.float32)
    if isinstance(step, Tensor):
        step = (step.to(dtype) if dtype == torch.bfloat16 else step).to(wide)
    else:
        step = _round(step, dtype)
    decay = _as(values["decay_lr"], wide)
    o = update.to(dtype)

    def rounded(x: Tensor) -> Tensor:
        return x.to(dtype).to(wide)

    agree = (rounded(o.to(wide) * w.to(wide)) >= 0).to(dtype)
    t = rounded(rounded(rounded(w.to(wide) * agree.to(wide)) * decay) * step)
    return (rounded(w.to(wide) - t) - rounded(o.to(wide) * step)).to(dtype)


def _to_weights(w: Tensor, update: Tensor, layout: Layout, lr_mul: Value,
                values: dict[str, Value], hp: MuonConfig) -> Tensor:  # fmt: skip
    """Weight decay as `hp` says, then the orthogonal step −η·s·m·O on the weights; a bf16
    weight's η rounded to bf16 first (the 2025-11 record's gates: 0.023 → 0.02294921875).
    Eager, on `w` itself (ATen's in-place ops, no copy), which is returned."""
    dtype, wide = w.dtype, torch.promote_types(w.dtype, torch.float32)
    eager = not isinstance(values["lr"], Tensor)
    # A tall matrix's update is a transposed view; adding it to a row-major parameter walks
    # memory column-wise, 2-3x slower on a CPU than transposing it first.
    update = update.contiguous()
    decays = values["decay"] if eager else hp.weight_decay  # a compiled graph's branch is fixed
    if hp.weight_decay_form == "cautious" and decays:
        if hp.normuon_form == "o_dtype":
            # The record adds the decay into its bf16 O in place (fp32 arithmetic, one
            # rounding to O's dtype), with the coefficient λ·η rounded once to W's dtype.
            u_wide = torch.promote_types(torch.promote_types(update.dtype, dtype), wide)
            agree = (update * w >= 0).to(u_wide)
            coefficient = _as(values["coefficient"], u_wide)
            update = (update.to(u_wide) + (coefficient * agree) * w.to(u_wide)).to(update.dtype)
        else:
            agree = (update * w >= 0).to(dtype)
            decayed = (_as(values["decay_lr"], wide) * agree.to(wide)).to(dtype)
            decayed = (decayed.to(wide) * w.to(wide)).to(dtype)
            update = (update.to(dtype).to(wide) + decayed.to(wide)).to(dtype)
    elif hp.weight_decay_form == "decoupled":  # (coupled: the decay is in the gradient)
        keep = values["keep"]
        w = w.mul_(keep) if eager else (w.to(wide) * keep.to(wide)).to(dtype)  # type: ignore[union-attr]
    alpha = (values["neg_lr"] * layout.scale) * lr_mul
    if not isinstance(alpha, Tensor):  # ATen's add: one rounding of W + α·O
        return w.add_(update, alpha=alpha)
    alpha = alpha.to(wide).view(-1, *[1] * len(layout.shape))
    return (w.to(wide) + update.to(wide) * alpha).to(dtype)


@dataclass(frozen=True)
class Settings:
    """What `stack_update` is specialised to: the Muon settings, the Newton–Schulz dtype and
    coefficients (`chosen_coefficients(hp)`, made once, outside the compiled graph)."""

    hp: MuonConfig
    ns_dtype: torch.dtype
    coefficients: Chosen


def stack_update(
    settings: Settings,
    layouts: tuple[Layout, ...],
    grads: list[Tensor],
    weights: list[Tensor],
    momenta: list[Tensor],
    moments: list[list[Tensor]],
    mantissas: list[Tensor | None],
    lr_muls: list[Value],
    scalars: list[dict[str, Value]],
) -> list[Tensor]:
    """One Muon step of stacks that one rank updates whole: `grads[b]` and `weights[b]` are
    stack b's gradients and weights (k, *shape), `scalars[b]` its step values (`host_values`);
    the state is updated in place, and the new weights are returned, stacked, in the weights'
    dtype. Every list has one entry per stack of `layouts`. Newton–Schulz runs over every
    piece of every stack, batched by shape."""
    hp = settings.hp
    updates = [momentum(g, buf, v, hp, w=w)
               for g, buf, w, v in zip(grads, momenta, weights, scalars, strict=True)]  # fmt: skip
    parts = [layout.pieces(u) for layout, u in zip(layouts, updates, strict=True)]  # type: ignore[arg-type]
    flat = orthogonalise([p for ps in parts for p in ps], settings.coefficients, hp.ns_steps,
                         hp.eps, settings.ns_dtype, hp.ns_form)  # fmt: skip
    out = []
    for b, layout in enumerate(layouts):
        mine = [flat.pop(0) for _ in parts[b]]
        out.append(finish(layout, weights[b], mine, moments[b], mantissas[b], lr_muls[b],
                          scalars[b], hp))  # fmt: skip
    return out


def compiled(backend: str | None) -> Callable[..., list[Tensor]]:
    """`stack_update`, compiled with `backend` (static shapes, one graph) or as it is."""
    if backend is None:
        return stack_update
    options = {"emulate_precision_casts": True} if backend == "inductor" else None
    return torch.compile(stack_update, dynamic=False, fullgraph=True, backend=backend,
                         options=options)  # fmt: skip


def scalar_tensors() -> dict[str, Tensor]:
    """The 0-d float64 CPU tensors the compiled step reads its values from (CPU scalars
    enter a GPU kernel as arguments: no copy, no sync)."""
    return {k: torch.zeros((), dtype=torch.float64) for k in SCALARS}


def fill(tensors: dict[str, Tensor], values: dict[str, float]) -> None:
    for key, value in values.items():
        tensors[key].fill_(value)
