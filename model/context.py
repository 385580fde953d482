"""What every layer of one forward shares, computed once before the first layer."""

from dataclasses import dataclass, field

from torch import Tensor, nn

from model.kv_cache import KVCache
from model.masks import Mask
from model.scalars import Scalars


@dataclass
class Context:
    """What every layer of one forward shares: what this forward computed once (x0, x02, the
    value-embedding lookups, the masks by window, the YaRN stage and its attention scale,
    the bigram term b), the model's parts that several layers read (each None when its
    option is off), and the micro-steps per update (the FP8 MLP's slots,
    model/mlp_fp8.py). Block 0's raw values are set once block 0 has run (the value
    residual)."""

    x0: Tensor | None  # None unless a layer reads it
    value_embeds: dict[int, Tensor]
    masks: dict[str | None, Mask] | None
    scalars: Scalars
    yarn_stage: Tensor | None = None
    attn_scale: Tensor | float | None = None  # YaRN's of the stage, or the config's
    x02: Tensor | None = None  # RMSNorm of the second table's lookup (model.embed.second_table)
    bigram_term: Tensor | None = None  # b (B, T, k)
    # The parts, typed as modules: the modules of MUDD and the value mixes read this context,
    # so naming their classes here would make an import cycle.
    bigram: nn.Module | None = None  # model/bigram.py BigramHash
    sublayer_scales: nn.Module | None = None  # model/residual.py SublayerScales
    x0_injection: nn.Module | None = None  # model/residual.py X0Injection
    x0_lambdas: nn.Module | None = None  # model/residual.py X0Lambdas
    xsa: nn.Module | None = None  # model/xsa.py XSA
    value_gates: nn.Module | None = None  # model/values.py ValueGates
    mudd: nn.Module | None = None  # model/mudd.py MUDD
    micro_steps: int = 1
    v1: Tensor | None = field(default=None)
    kv: KVCache | None = None  # generation's keys and values so far (model/kv_cache.py)

    def mask(self, key: str | None) -> Mask | None:
        """The mask of window kind `key` (model/masks.py), None where attention is causal."""
        return None if self.masks is None else self.masks[key]
