"""The layer plan: what each layer of the GPT has, computed once from the config.

The records' per-layer tables (docs/records.md, B.1) are plans: which layers attend, with a
long or a short window, which value-embedding table each layer reads, and which encoder
output each decoder layer adds at its input (U-net). The config writes the first three as
patterns over a reference depth, one character per layer; a pattern of another length is
resampled to `n_layer` by the nearest-layer rule: layer ℓ of n takes the character of
reference layer round(ℓ·(m−1)/(n−1)) of m. At the reference depth that is the pattern itself;
the 2025-01 record's 12-layer layout at 4 layers becomes: layer 0 = record layer 0, 1 = 4,
2 = 7 (no attention), 3 = 11; the 2025-11 record's (`mlp.layers` ".MMMMMMMMMMM",
`attention.layers` ".AAAAAA.AAAA") becomes: 0 empty, 1 attention + MLP, 2 MLP only,
3 attention + MLP. A layer with neither attention nor MLP is skipped whole. The U-net pairing
is structural: the first n//2 layers are the encoder; decoder layer E+i adds the output of
encoder layer E−1−i (when there is one).
"""

from dataclasses import dataclass

from model.config import ModelConfig
from model.masks import paired_key


@dataclass(frozen=True)
class LayerSpec:
    attention: bool  # False: the block is x + MLP(x) only
    window: str | None  # "long", "short", or None (all of the past)
    value_embed: int | None  # the value-embedding table this layer adds to its values
    skip_from: int | None  # U-net: the earlier layer whose output is added at the input
    mlp: bool = True  # False: no MLP (with no attention either, the block is skipped)
    xsa: bool = False  # learnable XSA on this layer's attention output
    mudd: bool = False  # the MUDD block (model.residual.mudd): the last layer
    paired: bool = False  # paired-head attention (model/paired.py)
    value_slot: int | None = None  # its `value_gates.weight` row: the how-many-th with a table

    @property
    def empty(self) -> bool:
        return not self.attention and not self.mlp

    @property
    def mask_key(self) -> str | None:
        """The key of the mask this layer's attention reads in the forward's masks
        (model/masks.py `build_masks`): its window kind, over the doubled sequence when its
        heads are paired. The model builds the masks of its plan's keys (`mask_kinds`)."""
        return paired_key(self.window) if self.paired else self.window


def mask_kinds(plan: list[LayerSpec]) -> tuple[set[str | None], frozenset[str | None]]:
    """The window kinds whose masks the plan's attention layers read: (normal, paired), as
    `build_masks` takes them."""
    normal = {s.window for s in plan if s.attention and not s.paired}
    return normal, frozenset(s.window for s in plan if s.attention and s.paired)


def resample(pattern: str, n: int) -> str:
    """`pattern` (one character per layer of its own depth) at depth `n`, nearest layer."""
    m = len(pattern)
    if n == 1:
        return pattern[0]
    return "".join(pattern[round(layer * (m - 1) / (n - 1))] for layer in range(n))


def layer_plan(cfg: ModelConfig) -> list[LayerSpec]:
    n = cfg.n_layer
    att, tables = cfg.attention, cfg.embed.value_embeds
    attention = resample(att.layers, n) if att.layers else "A" * n
    window = resample(att.window, n) if att.window else None
    tables = resample(tables, n) if tables else "." * n
    mlps = resample(cfg.mlp.layers, n) if cfg.mlp.layers else "M" * n
    xsa = resample(att.xsa, n) if att.xsa else "." * n
    paired = resample(att.paired, n) if att.paired else "." * n
    encoder = n // 2
    plan = []
    for layer in range(n):
        skip = encoder - 1 - (layer - encoder) if cfg.residual.unet and layer >= encoder else None
        plan.append(
            LayerSpec(
                attention=attention[layer] == "A",
                window=None if window is None else {"L": "long", "S": "short"}[window[layer]],
                value_embed=None if tables[layer] == "." else int(tables[layer]),
                skip_from=skip if skip is not None and skip >= 0 else None,
                mlp=mlps[layer] == "M",
                xsa=xsa[layer] == "X" and attention[layer] == "A",
                mudd=cfg.residual.mudd and layer == n - 1,
                paired=paired[layer] == "P" and attention[layer] == "A",
                value_slot=None if tables[layer] == "." else layer - tables[:layer].count("."),
            )
        )
        if plan[-1].paired and plan[-1].xsa:
            raise ValueError(
                f"layer {layer} is paired (model.attention.paired) and has XSA "
                "(model.attention.xsa): a paired layer has no XSA"
            )
    return plan


def describe_plan(plan: list[LayerSpec]) -> str:
    """One line per layer, for the startup log: "0: attn long ve0 | 1: attn short | ..."."""
    parts = []
    for i, s in enumerate(plan):
        bits = ["empty" if s.empty else "attn" if s.attention else "mlp only"]
        if s.attention and not s.mlp:
            bits.append("no mlp")
        if s.attention and s.window:
            bits.append(s.window)
        if s.paired:
            bits.append("paired")
        if s.xsa:
            bits.append("xsa")
        if s.mudd:
            bits.append("mudd")
        if s.value_embed is not None:
            bits.append(f"ve{s.value_embed}")
        if s.skip_from is not None:
            bits.append(f"+out{s.skip_from}")
        parts.append(f"{i}: {' '.join(bits)}")
    return " | ".join(parts)
