"""Every scalar of the model in one fp32 vector (model.numerics.packed_scalars), the 2025-11
record's layout (scalars_layout=mixes; record_2025_11_29's scalar vector, docs/records.md C.1). For
n layers:

    0 … n−1            skip-gate logits, init −1.5; only index 1 is read (the record's w_skip,
                       whatever layers the one skip of model.residual.skips joins)
    n + 2ℓ, n + 2ℓ + 1     (a_ℓ, b_ℓ): the x0 shortcut's mix of layer ℓ, init (x0_mix_a_init, 0)
    3n + 2ℓ, 3n + 2ℓ + 1   (α_ℓ, β_ℓ): the value mix of layer ℓ, init (0.5, 0.5)
    5n                 λ_smear, init 0
    5n + 1             λ_back (backout), init 0.5
    then ones up to a multiple of model.numerics.scalars_multiple

The record pads to a multiple of its world size (8), so its count depends on the rank count;
here the multiple is a config key (8 by default), the same on any rank count. One vector means
one Adam tensor instead of dozens of tiny ones. Entries no option reads get a zero gradient and
so never move.

record_2026_07_17's vector (model.numerics.scalars_layout=weight_lambdas, D.1 "Scalar vector"):

    2ℓ, 2ℓ + 1         (λ⁰_ℓ, λ¹_ℓ): the multipliers of W_qkv and W_o of layer ℓ, init (0.5, 1)
                       (model.attention.weight_lambdas; layers without attention keep theirs)
    2n                 λ_smear, init 0
    2n + 1             w_skip, the skip gate's logit, init −1.5
    then ones up to the multiple (the record: 2·11 + 2 = 24, no padding on 8 ranks)

It has no x0 mix, value mix or backout: the options that read those refuse this layout.

record_medium_2025_12_31's vector (model.numerics.scalars_layout=residual_weight_lambdas, M.1
"Scalar vector σ⃗"), for K gated skips:

    ℓ                  r_ℓ: the stream's scale before layer ℓ, init model.residual.x0_mix_a_init
                       (the x0 shortcut's a; its b and x02's weight are `x0_lambdas`, #52)
    n + 2ℓ, n + 2ℓ + 1     (λ⁰_ℓ, λ¹_ℓ), init (0.5, 1), as record_2026_07_17's
    3n                 λ_smear, init 0
    3n + 1             λ_back (backout), init 0.5
    3n + 2 + k         w_k, the logit of skip k, init −1.5
    then ones up to the multiple (the record: 3·16 + 2 + 3 = 53, padded to 56 on 8 ranks)

It has no value mix: the ungated value tables refuse this layout.
"""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from model.config import ModelConfig

SKIP_GATE_INIT = -1.5  # σ(−1.5) = 0.18: the skip starts mostly closed
VALUE_MIX_INIT = 0.5
SMEAR_INIT = 0.0  # the smear starts as the identity
BACKOUT_INIT = 0.5
WEIGHT_LAMBDAS_INIT = (0.5, 1.0)  # (λ⁰, λ¹): record_2026_07_17's W_qkv and W_o multipliers
LAYOUTS = ("mixes", "weight_lambdas", "residual_weight_lambdas")


def padded(used: int, multiple: int) -> int:
    """`used` entries padded up to a multiple of `multiple`."""
    return used + (-used) % multiple


@dataclass(frozen=True)
class ScalarLayout:
    """Where each scalar sits in the packed vector of an `n_layer`-layer model."""

    n_layer: int
    multiple: int

    def skip_gate(self, k: int) -> int:
        """The logit of skip k: the one read is index 1 (one skip only)."""
        return 1

    def x0_mix(self, layer: int) -> slice:
        return slice(self.n_layer + 2 * layer, self.n_layer + 2 * layer + 2)

    def value_mix(self, layer: int) -> slice:
        return slice(3 * self.n_layer + 2 * layer, 3 * self.n_layer + 2 * layer + 2)

    @property
    def smear(self) -> int:
        return 5 * self.n_layer

    @property
    def backout(self) -> int:
        return 5 * self.n_layer + 1

    @property
    def size(self) -> int:
        return padded(5 * self.n_layer + 2, self.multiple)

    def initial(self, a_init: float) -> Tensor:
        """The vector's initial values (fp32)."""
        n = self.n_layer
        v = torch.ones(self.size, dtype=torch.float32)  # the padding stays 1
        v[:n] = SKIP_GATE_INIT
        v[n : 3 * n : 2], v[n + 1 : 3 * n : 2] = a_init, 0.0
        v[3 * n : 5 * n] = VALUE_MIX_INIT
        v[self.smear], v[self.backout] = SMEAR_INIT, BACKOUT_INIT
        return v


@dataclass(frozen=True)
class WeightLambdasLayout:
    """Where each scalar sits in the weight_lambdas vector, record_2026_07_17's (module
    docstring)."""

    n_layer: int
    multiple: int

    def weight_lambdas(self, layer: int) -> slice:
        return slice(2 * layer, 2 * layer + 2)

    @property
    def smear(self) -> int:
        return 2 * self.n_layer

    def skip_gate(self, k: int) -> int:
        """The logit of skip k (one skip only)."""
        return 2 * self.n_layer + 1

    @property
    def size(self) -> int:
        return padded(2 * self.n_layer + 2, self.multiple)

    def initial(self, a_init: float) -> Tensor:
        """The vector's initial values (fp32); `a_init` is unused (no x0 mix here)."""
        v = torch.ones(self.size, dtype=torch.float32)
        v[0 : 2 * self.n_layer : 2], v[1 : 2 * self.n_layer : 2] = WEIGHT_LAMBDAS_INIT
        v[self.smear], v[self.skip_gate(0)] = SMEAR_INIT, SKIP_GATE_INIT
        return v


@dataclass(frozen=True)
class ResidualWeightLambdasLayout:
    """Where each scalar sits in the residual_weight_lambdas vector, record_medium_2025_12_31's
    (module docstring), with `skips` gated skips."""

    n_layer: int
    multiple: int
    skips: int

    def resid(self, layer: int) -> int:
        return layer

    def weight_lambdas(self, layer: int) -> slice:
        return slice(self.n_layer + 2 * layer, self.n_layer + 2 * layer + 2)

    @property
    def smear(self) -> int:
        return 3 * self.n_layer

    @property
    def backout(self) -> int:
        return 3 * self.n_layer + 1

    def skip_gate(self, k: int) -> int:
        return 3 * self.n_layer + 2 + k

    @property
    def size(self) -> int:
        return padded(3 * self.n_layer + 2 + self.skips, self.multiple)

    def initial(self, a_init: float) -> Tensor:
        """The vector's initial values (fp32): r_ℓ = `a_init`."""
        n = self.n_layer
        v = torch.ones(self.size, dtype=torch.float32)
        v[:n] = a_init
        v[n : 3 * n : 2], v[n + 1 : 3 * n : 2] = WEIGHT_LAMBDAS_INIT
        v[self.smear], v[self.backout] = SMEAR_INIT, BACKOUT_INIT
        v[self.skip_gate(0) : self.skip_gate(self.skips)] = SKIP_GATE_INIT
        return v


class Scalars(nn.Module):
    """The model-level scalars: the packed vector `packed` and its `layout`
    (model.numerics.packed_scalars), or one parameter each, `skip_gate` (one per gated skip: a
    0-d tensor for one, a vector for several), `smear_lambda` and `backout_lambda`, for the
    options that are on (the others None). The per-layer ones (x0 mix, value mix) are their
    modules' when not packed."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        num = cfg.numerics
        self.layout: ScalarLayout | WeightLambdasLayout | ResidualWeightLambdasLayout | None = None
        self.packed = self.skip_gate = self.smear_lambda = self.backout_lambda = None
        skips = len(cfg.residual.skips)
        if num.packed_scalars:
            if num.scalars_layout == "residual_weight_lambdas":
                self.layout = ResidualWeightLambdasLayout(cfg.n_layer, num.scalars_multiple, skips)
            elif num.scalars_layout == "weight_lambdas":
                self.layout = WeightLambdasLayout(cfg.n_layer, num.scalars_multiple)
            else:
                self.layout = ScalarLayout(cfg.n_layer, num.scalars_multiple)
            self.packed = nn.Parameter(torch.empty(self.layout.size))
            return
        if skips:
            shape = () if skips == 1 else (skips,)
            self.skip_gate = nn.Parameter(torch.full(shape, SKIP_GATE_INIT))
        if cfg.embed.smear:
            self.smear_lambda = nn.Parameter(torch.tensor(SMEAR_INIT))
        if cfg.residual.backout_layer >= 0:
            self.backout_lambda = nn.Parameter(torch.tensor(BACKOUT_INIT))

    @torch.no_grad()
    def reset(self, a_init: float) -> None:
        """The packed vector at its tabled values (the own parameters are made at theirs);
        `a_init`: the x0 mix's a (model.residual.x0_mix_a_init), record_medium_2025_12_31's r."""
        if self.layout is not None:
            self.packed.copy_(self.layout.initial(a_init))

    def skip(self, k: int = 0) -> Tensor:
        """The logit w_k of gated skip k."""
        if self.layout is not None:
            return self.packed[self.layout.skip_gate(k)]
        return self.skip_gate if self.skip_gate.ndim == 0 else self.skip_gate[k]

    def smear(self) -> Tensor:
        """λ_smear."""
        return self.smear_lambda if self.layout is None else self.packed[self.layout.smear]

    def backout(self) -> Tensor:
        """λ_back."""
        return self.backout_lambda if self.layout is None else self.packed[self.layout.backout]

    def x0_mix(self, layer: int) -> Tensor | None:
        """(a, b) of layer `layer`'s x0 mix in the packed vector; None when not packed."""
        return None if self.layout is None else self.packed[self.layout.x0_mix(layer)]

    def value_mix(self, layer: int) -> Tensor | None:
        """(α, β) of layer `layer`'s value mix in the packed vector; None when not packed."""
        return None if self.layout is None else self.packed[self.layout.value_mix(layer)]

    def weight_lambdas(self, layer: int) -> Tensor:
        """(λ⁰, λ¹) of layer `layer` (record_2026_07_17's and M's layouts)."""
        return self.packed[self.layout.weight_lambdas(layer)]

    def resid(self, layer: int) -> Tensor:
        """r_ℓ, the stream's scale before layer `layer` (record_medium_2025_12_31's layout)."""
        return self.packed[self.layout.resid(layer)]
