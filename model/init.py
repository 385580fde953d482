"""The GPT's initialisation, as the records draw it.

Every residual-branch output and the head start at 0 (record_2026_07_17 draws W_o uniformly,
attention.out_init, and the head N(0, 0.005²), head.init_std, with the token table its
transpose, embed.tied_init): with the output projections at zero
each block starts as the identity, and with the head at zero the first loss is exactly
ln(vocab_size), whatever the seed. Hidden matrices (q, k, v, fc) are uniform with std
model.init_std/√fan_in; embeddings N(0, 1); gates 0 (σ(0) = ½); the packed scalars and the
sublayer scales their tabled values. With model.numerics.dtype=bf16 the tables, the gates and
(head.bf16) the head become bf16 parameters: N(0, 1) rounded to bf16, as the records'.

The draws happen in this order (the RNG stream decides every value): the token table, the
value tables, then each block's q/k/v and fc (or its router and expert fc stack,
model.mlp.experts), the head, the second token table
(embed.second_table), then MUDD's W1 (model/mudd.py). record_medium_2025_12_31's zero value tables
(embed.value_std=0) draw nothing.
"""

import torch
from torch import nn

from model.attention import init_bound
from model.moe import MoE


@torch.no_grad()
def initialise(model: nn.Module) -> None:
    """Draw every parameter of `model` (a `GPT`) in place."""
    cfg = model.cfg
    values = [] if model.value_embeds is None else list(model.value_embeds.values())
    tables = [model.embed, *values]
    tables += [] if model.embed2 is None else [model.embed2]
    nn.init.normal_(model.embed.weight, std=1.0)
    for table in values:
        if cfg.embed.value_std:
            nn.init.normal_(table.weight, std=cfg.embed.value_std)
        else:  # record_medium_2025_12_31's tables start at zero
            nn.init.zeros_(table.weight)
    # q, k, v and fc all read the d-wide stream; q, k, v may have a std of their own
    bound = init_bound(cfg, cfg.n_embd)
    attn_bound = init_bound(cfg, cfg.n_embd, cfg.attention.init_std)
    for block in model.blocks:
        weights = block.attn.qkv_weights() if block.attn is not None else []
        for w in weights:
            nn.init.uniform_(w, -attn_bound, attn_bound)
        if isinstance(block.mlp, MoE):  # the router and the experts draw their own
            block.mlp.reset(bound)
        elif block.mlp is not None:
            nn.init.uniform_(block.mlp.fc.weight, -bound, bound)
        if block.attn is not None:
            if not block.attn.out_uniform:
                nn.init.zeros_(block.attn.out_weight())
            if block.attn.gate is not None:  # σ(0): every gate starts half open
                nn.init.zeros_(block.attn.gate.weight)
            block.attn.reset_lambdas()
        if block.mlp is not None and not isinstance(block.mlp, MoE):
            nn.init.zeros_(block.mlp.proj.weight)
    if cfg.head.init_std:  # record_2026_07_17: N(0, 0.005²), so the first loss is not ln(vocab)
        nn.init.normal_(model.lm_head.weight, std=cfg.head.init_std)
    else:
        nn.init.zeros_(model.lm_head.weight)
    if model.embed2 is not None:  # record_medium_2025_12_31's second table (M10)
        nn.init.normal_(model.embed2.weight, std=1.0)
    if cfg.embed.tied_init:  # E = W_headᵀ: lm_head.weight is (vocab, d) as E is
        model.embed.weight.copy_(model.lm_head.weight)
    if model.smear_gate is not None:
        nn.init.zeros_(model.smear_gate.weight)
    model.skips.reset()
    model.scalars.reset(cfg.residual.x0_mix_a_init)
    # The parts that are on, each drawing its own (model/part.py), in the order the model
    # registers them (MUDD in its own dtype already); the bigram part last: its sign draw
    # leaves the other parameters' draws as they were.
    for part in model.parts():
        part.reset()
    if cfg.numerics.dtype == "bf16":
        for module in [*tables, *gates(model)]:  # the 2025-11 record's gates are bf16 too
            module.to(torch.bfloat16)
        if cfg.head.bf16:
            model.lm_head.to(torch.bfloat16)
        for part in model.parts():  # what each part holds in bf16 (the bigram table, gates)
            part.cast_bf16()
        if cfg.numerics.bf16_matrices:  # record_2026_07_17's bf16 weights (fp32 master: optimizer)
            for w in matrices(model):
                w.data = w.data.to(torch.bfloat16)


def gates(model: nn.Module) -> list[nn.Module]:
    """The attention gates and the smear gate, where they exist."""
    attns = [b.attn for b in model.blocks if b.attn is not None]
    out = [a.gate for a in attns if a.gate is not None]
    out += [] if model.skips.token_gate is None else [model.skips.token_gate]
    return out + ([] if model.smear_gate is None else [model.smear_gate])


def matrices(model: nn.Module) -> list[nn.Parameter]:
    """The hidden matrices of the attention and MLP sublayers (not their gates or scalars)."""
    out = []
    for block in model.blocks:
        attn = block.attn
        if attn is not None:
            out += attn.matrices()
        if block.mlp is not None:
            out += block.mlp.matrices()
    return out
