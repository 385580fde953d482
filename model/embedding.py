"""The stream's input: token embeddings, the smear, and the value-embedding lookups.

e = E[tokens]
e'_t = e_t + λ·σ(e_t[:k]·wᵀ)·e_(t−1)   smear (model.embed.smear; the 2025-11 record), t ≥ 1
                                       within each row (the previous token may lie in the
                                       previous document), e'_0 = e_0; the mixed-in
                                       e_(t−1) is un-smeared; w (1 × k) zero, λ from 0
x = x0 = RMSNorm(e')
ve_t = VE_t[tokens]                    for every value-embedding table t
"""

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.plan import LayerSpec


def value_tables(cfg: ModelConfig, plan: list[LayerSpec], rows: int) -> nn.ModuleDict | None:
    """The value-embedding tables the plan's layers read, by table number; None if none."""
    tables = sorted({s.value_embed for s in plan if s.value_embed is not None})
    if not tables:
        return None
    return nn.ModuleDict({str(t): nn.Embedding(rows, cfg.n_embd) for t in tables})


def smear(e: Tensor, gate: nn.Module, lam: Tensor, k: int) -> Tensor:
    """e' from e (B, T, d): the module docstring's smear, gate = w as a (k → 1) linear."""
    g = torch.sigmoid(gate(e[:, 1:, :k]))
    return torch.cat([e[:, :1], e[:, 1:] + lam * g * e[:, :-1]], dim=1)


def value_lookups(tables: nn.ModuleDict | None, idx: Tensor) -> dict[int, Tensor]:
    return {int(t): ve(idx) for t, ve in (tables or {}).items()}
