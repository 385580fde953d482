"""Where each head sits for the attention kernel (model/attention.py): `Heads` puts each head in
its own slot over T positions, with the long-window layers' keys offset on the channels the
rotary leaves unrotated (model.attention.key_offset, `offset_keys`); `PairedHeads` puts heads h
and h + H/2 in one slot over 2T positions (model.attention.paired, model/paired.py).
"""

import torch
from torch import Tensor

from model.paired import double, paired_positions, undouble
from model.rotary import Rotary


class Heads:
    """Each head in its own slot over T positions (B, H, T, D); the long-window layers'
    keys offset with attention.key_offset, on the channel spans `offset` (none: no offset)."""

    def __init__(self, offset: tuple[tuple[int, int], ...] = ()) -> None:
        self.offset = offset

    def arrange(
        self, q: Tensor, k: Tensor, v: Tensor, rotary: Rotary, stage: Tensor | None, start: int = 0
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`start`: the position of the first token (a KV cache's, model/kv_cache.py)."""
        pos = None
        if start:  # the same products t·ω as the rotary's own positions 0 … T−1
            t = torch.arange(start, start + q.size(1), device=q.device, dtype=torch.float32)
            pos = t[:, None].expand(-1, q.size(2))
        q, k = rotary(q, stage, pos), rotary(k, stage, pos)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        return q, offset_keys(k, self.offset) if self.offset else k, v

    def restore(self, y: Tensor) -> Tensor:
        return y


class PairedHeads:
    """Heads h and h + H/2 in one slot over 2T positions, rotary at 2t / 2t+1, no key offset
    (model.attention.paired, model/paired.py)."""

    def arrange(
        self, q: Tensor, k: Tensor, v: Tensor, rotary: Rotary, stage: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor]:
        pos = paired_positions(q.size(1), q.size(2), q.device)
        q, k = rotary(q, stage, pos), rotary(k, stage, pos)
        return double(q), double(k), double(v)

    def restore(self, y: Tensor) -> Tensor:
        """Back to (B, H, T, D): slot s at 2t is head s, at 2t+1 head s + H/2."""
        return undouble(y)


def offset_keys(k: Tensor, spans: tuple[tuple[int, int], ...]) -> Tensor:
    """k_t[c] <- k_(t−1)[c] for t ≥ 1 and the channels c of `spans` ([a, b) ranges, in
    order) over (B, H, T, D) keys, from the un-shifted values; k_0 and the other channels as
    they are (model.attention.key_offset: the rotary's static channels, `static_spans`)."""
    pieces, at = [], 0
    for a, b in spans:
        late = torch.cat([k[..., :1, a:b], k[..., :-1, a:b]], dim=-2)
        pieces += [k[..., at:a], late] if a > at else [late]
        at = b
    pieces += [k[..., at:]] if at < k.size(-1) else []
    return torch.cat(pieces, dim=-1)
