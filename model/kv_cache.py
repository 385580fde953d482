"""The keys and values of the tokens a generation has seen (scripts/sample.py): each new
token's forward attends to them instead of rerunning the whole context.

    cache = KVCache(capacity=context)
    logits = model(prompt, cache=cache, last=True)      # the prompt's keys and values, kept
    logits = model(next_token, cache=cache, last=True)  # one token: its own, the rest cached

A forward over T new tokens after `length` cached ones places them at positions length …
length + T − 1 (the rotary angles), adds each attention layer's keys and values to the
cache, and lets query p attend to the keys j ≤ p of its own document where the model masks
documents (model/masks.py: an EOT opens one). Every other part of the model acts per
position, so the logits are the whole context's at those positions, up to the rounding of
other kernel shapes. The parts that read a neighbour's token or key, or a window, are not
cached here (`blockers`): sampling reruns the context for them.
"""

import torch
from torch import Tensor

from model.config import ModelConfig
from model.masks import EOT


def blockers(cfg: ModelConfig) -> list[str]:
    """The settings under which a cached forward would not compute what the whole context's
    does, each as the key that sets it; [] = the cache serves this model."""
    att, embed = cfg.attention, cfg.embed
    found = {
        "model.attention.window": bool(att.window or att.window_tokens),
        "model.attention.paired": bool(att.paired),
        "model.attention.key_offset": bool(att.key_offset),
        "model.attention.impl=varlen": att.impl == "varlen",
        "model.embed.smear": embed.smear,
        "model.bigram.rows": bool(cfg.bigram.rows),
        "model.mlp.experts": bool(cfg.mlp.experts),  # routing capacity depends on the batch
    }
    return [key for key, on in found.items() if on]


class KVCache:
    """Each attention layer's keys and values (B, H, length, D) of the tokens seen, in buffers
    of `capacity` positions allocated at a layer's first use (in its dtype and device)."""

    def __init__(self, capacity: int, document: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"a KV cache needs a capacity of 1 or more positions, got {capacity}")
        self.capacity, self.document = capacity, document
        self.length = 0  # positions cached
        self.start = 0  # the first position of the forward under way
        self.mask: Tensor | None = None  # (B | 1, 1, T, start + T) bool: True = attend
        self._keys: dict[int, Tensor] = {}
        self._values: dict[int, Tensor] = {}
        self._docs: Tensor | None = None  # (B, capacity) document ids, with `document`

    def begin(self, idx: Tensor) -> None:
        """Before a forward over the new tokens `idx` (B, T): their positions and mask."""
        T = idx.size(1)
        if self.length + T > self.capacity:
            raise ValueError(
                f"the KV cache holds {self.capacity} positions: {self.length} cached + {T} new "
                "do not fit (start a new cache for the cropped context)"
            )
        self.start, end = self.length, self.length + T
        query = torch.arange(self.start, end, device=idx.device)[:, None]
        mask = torch.arange(end, device=idx.device)[None, :] <= query  # (T, end)
        if self.document:
            if self._docs is None:
                self._docs = idx.new_zeros(idx.size(0), self.capacity)
            before = self._docs[:, self.start - 1 : self.start] if self.start else 0
            self._docs[:, self.start : end] = before + (idx == EOT).cumsum(-1)
            docs = self._docs[:, :end]
            mask = mask & (docs[:, self.start : end, None] == docs[:, None, :])  # (B, T, end)
        self.mask = mask[:, None] if mask.dim() == 3 else mask[None, None]

    def extend(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Layer `layer`'s keys and values (B, H, T, D) of this forward added: all of its
        keys and values so far, (B, H, start + T, D)."""
        if layer not in self._keys:
            B, H, _, D = k.shape
            self._keys[layer] = k.new_empty(B, H, self.capacity, D)
            self._values[layer] = v.new_empty(B, H, self.capacity, v.size(-1))
        end = self.start + k.size(2)
        self._keys[layer][:, :, self.start : end] = k
        self._values[layer][:, :, self.start : end] = v
        return self._keys[layer][:, :, :end], self._values[layer][:, :, :end]

    def end(self, new: int) -> None:
        """After the forward: its `new` tokens are cached."""
        self.length = self.start + new
