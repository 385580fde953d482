"""What every layer of one forward shares, computed once before the first layer."""

from dataclasses import dataclass, field

from torch import Tensor

from model.kv_cache import KVCache
from model.masks import Mask


@dataclass
class Context:
    """What one forward computed once for every layer: x0 and the second table's x02, the
    value-embedding lookups, the masks by window, the YaRN stage and its attention scale, the
    bigram term b, and the micro-steps per update it runs under (the FP8 MLP's slots,
    model/mlp_fp8.py). Block 0's raw values are set once block 0 has run (the value residual).
    The model's parts are not here: they act at the forward's named points (model/points.py)."""

    x0: Tensor | None  # None unless a layer reads it
    value_embeds: dict[int, Tensor]
    masks: dict[str | None, Mask] | None
    yarn_stage: Tensor | None = None
    attn_scale: Tensor | float | None = None  # YaRN's of the stage, or the config's
    x02: Tensor | None = None  # RMSNorm of the second table's lookup (model.embed.second_table)
    bigram_term: Tensor | None = None  # b (B, T, k)
    micro_steps: int = 1
    v1: Tensor | None = field(default=None)
    kv: KVCache | None = None  # generation's keys and values so far (model/kv_cache.py)

    def mask(self, key: str | None) -> Mask | None:
        """The mask of window kind `key` (model/masks.py), None where attention is causal."""
        return None if self.masks is None else self.masks[key]
