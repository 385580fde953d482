"""The GPT's initialisation, as the records draw it.

Every residual-branch output and the head start at 0: with the output projections at zero
each block starts as the identity, and with the head at zero the first loss is exactly
ln(vocab_size), whatever the seed. Hidden matrices (q, k, v, fc) are uniform with std
model.init_std/√fan_in; embeddings N(0, 1); gates 0 (σ(0) = ½); the packed scalars and the
sublayer scales their tabled values. With model.numerics.dtype=bf16 the tables, the gates and
(head.bf16) the head become bf16 parameters: N(0, 1) rounded to bf16, as the records'.

The draws happen in this order (the RNG stream decides every value): the token table, the
value tables, then each block's q/k/v and fc.
"""

import torch
from torch import nn

from model.attention import init_bound
from model.bigram import reset_bigram
from model.residual import reset_sublayer_scales, reset_x0_injection
from model.xsa import reset_xsa


@torch.no_grad()
def initialise(model: nn.Module) -> None:
    """Draw every parameter of `model` (a `GPT`) in place."""
    cfg = model.cfg
    values = list((getattr(model, "value_embeds", None) or {}).values())
    tables = [model.embed, *values]
    tables += [model.bigram_embed] if hasattr(model, "bigram_embed") else []
    nn.init.normal_(model.embed.weight, std=1.0)
    for table in values:
        nn.init.normal_(table.weight, std=cfg.embed.value_std)
    bound = init_bound(cfg, cfg.n_embd)  # q, k, v and fc all read the d-wide stream
    for block in model.blocks:
        weights = block.attn.qkv_weights() if block.attn is not None else []
        weights += [block.mlp.fc.weight] if block.mlp is not None else []
        for w in weights:
            nn.init.uniform_(w, -bound, bound)
        if block.attn is not None:
            nn.init.zeros_(block.attn.out_weight())
            for gate in ("gate", "value_gate"):  # σ(0): every gate starts half (or 2·½) open
                if hasattr(block.attn, gate):
                    nn.init.zeros_(getattr(block.attn, gate).weight)
        if block.mlp is not None:
            nn.init.zeros_(block.mlp.proj.weight)
    nn.init.zeros_(model.lm_head.weight)
    for gate in ("smear_gate", "skip_token_gate"):
        if hasattr(model, gate):
            nn.init.zeros_(getattr(model, gate).weight)
    if model.layout is not None:
        model.scalars.copy_(model.layout.initial(cfg.residual.x0_mix_a_init))
    reset_sublayer_scales(model, cfg)
    reset_xsa(model)
    reset_x0_injection(model)
    reset_bigram(model, cfg)  # last: its sign draw leaves the other parameters' draws as they were
    if cfg.numerics.dtype == "bf16":
        for module in [*tables, *gates(model)]:  # the 2025-11 record's gates are bf16 too
            module.to(torch.bfloat16)
        if cfg.head.bf16:
            model.lm_head.to(torch.bfloat16)


def gates(model: nn.Module) -> list[nn.Module]:
    """The attention gates and the smear gate, where they exist."""
    attns = [b.attn for b in model.blocks if b.attn is not None]
    out = [getattr(a, g) for a in attns for g in ("gate", "value_gate") if hasattr(a, g)]
    out += [model.skip_token_gate] if hasattr(model, "skip_token_gate") else []
    return out + ([model.smear_gate] if hasattr(model, "smear_gate") else [])
