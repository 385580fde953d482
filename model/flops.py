"""The FLOPs of a training forward and backward over a batch of tokens: what MFU divides.

The convention is PaLM's (Chowdhery et al. 2022, appendix B), as nanoGPT's MFU estimate:

    FLOPs = 6·N·tokens + 12·d·P

N is the number of parameters that multiply activations: every hidden matrix (q, k, v, o, fc,
proj) and the LM head, not the embedding tables (a lookup multiplies nothing) nor the scalars;
of a mixture of experts, the router and the top_k / E share of the experts a token meets.
A token costs 2·N forward and 4·N backward. d is the attention width (heads × head dim), and
P the (query, key) pairs that attention computes, summed over rows and attention layers: each
pair costs 2·d for q·kᵀ and 2·d for scores·v forward, three times that with the backward.

PaLM counts every pair of the sequence. Here each layer counts the pairs its mask allows, by
the rule of `model/masks.py`: query i sees key j ≤ i, within its document with
model.attention.document_mask, and within ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 with a sliding window (long
layers N(s) blocks, short max(1, N(s)//2)); with token windows
(model.attention.window_granularity=token) within
i − j ≤ W tokens, long W = window_tokens and short W = short_window_tokens, counted exactly
the same way; MLP-only and empty layers none. A document-masked, windowed model is so
credited with the attention it computes, not with a whole packed sequence's: over the 2025-01
record's 49,152-token sequence, with documents ~1000 tokens long, causal attention would be 25
times the pairs that even its widest window lets through. (Masked elements that a kernel
computes anyway inside a partial tile are not counted.) A paired-head layer
(model.attention.paired) attends over 2T positions with H/2 heads: its pairs, by the same rule
over the doubled sequence, are half as wide (d/2). Recomputation and the optimizer
(Newton–Schulz) are not counted.

The pairs come from the batch's tokens on its device, O(B·T) with no host sync: query i
attends to the keys from max(doc_start(i), window_start(i)) to i, where doc_start is a
running maximum of the EOT positions. So the training loop can count every step for free and
read the count with the loss, in the step's one existing sync.
"""

from collections import Counter
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from model.config import ModelConfig
from model.masks import EOT, window_lengths
from model.plan import layer_plan


def matmul_params(model: nn.Module) -> int:
    """N: the elements of every weight matrix of `model` that multiplies activations (the
    parameters of 2 or more dimensions that are not embedding tables)."""
    tables = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    # an expert stack counts the share one token meets (top_k of E experts: model/moe.py)
    return round(sum(p.numel() * getattr(p, "active_share", 1.0) for p in model.parameters()
                     if p.ndim >= 2 and id(p) not in tables))  # fmt: skip


def keys_per_query(
    idx: Tensor, document: bool, n_blocks: Tensor | None, block: int, tokens: bool = False
) -> Tensor:
    """How many keys each query position of `idx` (B, T) attends to: (T,) when every row is
    alike (no document mask), else (B, T). `n_blocks`: the window in blocks (None: no window),
    or with `tokens` the window W in tokens (keys i − W … i)."""
    pos = torch.arange(idx.size(-1), device=idx.device)
    first = torch.zeros_like(pos)  # the first key each query sees
    if n_blocks is not None and tokens:
        first = (pos - n_blocks).clamp(min=0)
    elif n_blocks is not None:
        first = (pos // block - n_blocks + 1).clamp(min=0) * block
    if document:  # an EOT opens its document, so the latest one at or before i starts i's
        doc_start = torch.where(idx == EOT, pos, 0).cummax(-1).values
        first = torch.maximum(first, doc_start)
    return pos - first + 1


def attended_pairs(
    idx: Tensor, document: bool, n_blocks: Tensor | None, block: int, tokens: bool = False
) -> Tensor:
    """The (query, key) pairs one attention layer computes over `idx` (B, T), summed over its
    rows: a 0-d int64 tensor on `idx`'s device."""
    return keys_per_query(idx, document, n_blocks, block, tokens).expand(idx.shape).sum()


def training_flops(
    idx: Tensor,
    cfg: ModelConfig,
    n_params: int,
    window_tokens: Tensor | float | None = None,
    short_window_tokens: Tensor | float | None = None,
) -> Tensor:
    """FLOPs of one forward and backward over the tokens `idx` (B, T), as a 0-d float64 tensor
    on their device: 6·N·tokens + 12·d·P (module docstring). `n_params`: N (`matmul_params`);
    `window_tokens`: the step's window, as the model's forward takes it (a device tensor keeps
    the count free of host syncs)."""
    plan = layer_plan(cfg)
    kinds = Counter(s.window for s in plan if s.attention and not s.paired)
    paired = Counter(s.window for s in plan if s.paired)
    lengths: dict[str, Tensor] = {}
    token = cfg.attention.window_granularity == "token"
    if window_tokens is not None and token:
        for kind, w in (("long", window_tokens), ("short", short_window_tokens)):
            if w is not None:
                lengths[kind] = torch.as_tensor(w, device=idx.device).floor().long()
        if "short" in kinds | paired and "short" not in lengths:
            raise ValueError(
                "model.attention.window_granularity=token: count FLOPs with short_window_tokens"
            )
    elif window_tokens is not None:
        tokens = torch.as_tensor(window_tokens, dtype=torch.float64, device=idx.device)
        lengths = window_lengths(torch.ceil(tokens / cfg.attention.window_block).long())
    elif (kinds | paired).keys() - {None}:
        raise ValueError(
            "model.attention.window is set but no window size was given to count FLOPs"
        )
    pairs = torch.zeros((), dtype=torch.int64, device=idx.device)
    for kind, layers in kinds.items():
        n_blocks = lengths[kind] if kind is not None else None
        pairs = pairs + layers * attended_pairs(
            idx, cfg.attention.document_mask, n_blocks, cfg.attention.window_block, token
        )
    flops = 6.0 * n_params * idx.numel() + 12.0 * cfg.n_embd * pairs.double()
    if paired:  # 2T positions: token t's EOT at 2t opens its document, 2t+1 holds a non-EOT
        doubled = torch.stack([idx, torch.zeros_like(idx)], -1).flatten(-2)
        half = torch.zeros((), dtype=torch.int64, device=idx.device)
        for kind, layers in paired.items():
            n_blocks = lengths[kind] if kind is not None else None
            half = half + layers * attended_pairs(
                doubled, cfg.attention.document_mask, n_blocks, cfg.attention.window_block, token
            )
        flops = flops + 6.0 * cfg.n_embd * half.double()
    return flops


@dataclass(frozen=True)
class StepFlops:
    """One model's FLOP count as a function of a batch: `StepFlops.of(model)(idx, **args)`,
    with the forward's step-dependent arguments (`window_tokens`, `short_window_tokens`)."""

    cfg: ModelConfig
    n_params: int  # N, counted once

    @classmethod
    def of(cls, model: nn.Module) -> "StepFlops":
        """The count for a `GPT` (its config and matmul parameters)."""
        return cls(model.cfg, matmul_params(model))

    def __call__(
        self,
        idx: Tensor,
        window_tokens: Tensor | float | None = None,
        short_window_tokens: Tensor | float | None = None,
        yarn_stage: Tensor | None = None,
    ) -> Tensor:
        return training_flops(idx, self.cfg, self.n_params, window_tokens, short_window_tokens)
