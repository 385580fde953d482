"""Every scalar of the model in one fp32 vector (model.packed_scalars), the 2025-11 record's
layout (record C's scalar vector, docs/records.md C.1). For n layers:

    0 … n−1            skip-gate logits, init −1.5; only index 1 is read (the record's w_skip,
                       whatever model.skip_from / skip_to say)
    n + 2ℓ, n + 2ℓ + 1     (a_ℓ, b_ℓ): the x0 shortcut's mix of layer ℓ, init (x0_mix_a_init, 0)
    3n + 2ℓ, 3n + 2ℓ + 1   (α_ℓ, β_ℓ): the value mix of layer ℓ, init (0.5, 0.5)
    5n                 λ_smear, init 0
    5n + 1             λ_back (backout), init 0.5
    then ones up to a multiple of model.scalars_multiple

The record pads to a multiple of its world size (8), so its count depends on the rank count;
here the multiple is a config key (8 by default), the same on any rank count. One vector means
one Adam tensor instead of dozens of tiny ones. Entries no option reads get a zero gradient and
so never move.
"""

from dataclasses import dataclass

import torch
from torch import Tensor

SKIP_GATE_INIT = -1.5  # σ(−1.5) = 0.18: the skip starts mostly closed
VALUE_MIX_INIT = 0.5
SMEAR_INIT = 0.0  # the smear starts as the identity
BACKOUT_INIT = 0.5


@dataclass(frozen=True)
class ScalarLayout:
    """Where each scalar sits in the packed vector of an `n_layer`-layer model."""

    n_layer: int
    multiple: int

    skip_gate = 1  # the one skip-gate logit that is read

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
        used = 5 * self.n_layer + 2
        return used + (-used) % self.multiple

    def initial(self, a_init: float) -> Tensor:
        """The vector's initial values (fp32)."""
        n = self.n_layer
        v = torch.ones(self.size, dtype=torch.float32)  # the padding stays 1
        v[:n] = SKIP_GATE_INIT
        v[n : 3 * n : 2], v[n + 1 : 3 * n : 2] = a_init, 0.0
        v[3 * n : 5 * n] = VALUE_MIX_INIT
        v[self.smear], v[self.backout] = SMEAR_INIT, BACKOUT_INIT
        return v
