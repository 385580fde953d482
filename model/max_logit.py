"""The largest attention logit per head, for QK-clip (`optim/qk_clip.py`).

With `track_max_logit` on, each training forward of `CausalSelfAttention` folds its heads'
largest scale·q·kᵀ (over the pairs its mask allows) into `max_logit`; this module computes
that maximum in bounded memory.
"""

import torch
from torch import Tensor

from model.masks import Mask

# Query rows per chunk are chosen so that one chunk's logits hold at most this many values
# (256 MiB in fp32): tracking needs bounded memory whatever the sequence length.
TRACK_CHUNK = 2**26


def allowed_keys(
    mask: Mask | None, start: int, stop: int, lo: int, hi: int, device: torch.device
) -> Tensor:
    """Where queries [start, stop) may attend to keys [lo, hi) under `mask`, as a boolean tensor
    that broadcasts against (B, H, stop − start, hi − lo) logits."""
    if mask is None:
        rows = torch.arange(start, stop, device=device)[:, None]
        return rows >= torch.arange(lo, hi, device=device)[None, :]
    if isinstance(mask, Tensor):
        part = mask[..., start:stop, lo:hi]
        # An additive float mask forbids its −inf entries; a finite bias is not part of q·kᵀ.
        return part if part.dtype == torch.bool else part > float("-inf")
    from torch.nn.attention.flex_attention import create_mask

    def shifted(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return mask.mask_mod(b, h, q + start, kv + lo)

    B, H = mask.shape[:2]
    return create_mask(shifted, B, H, stop - start, hi - lo, device=device)


@torch.no_grad()
def max_logits(q: Tensor, k: Tensor, mask: Mask | None, scale: float | None) -> Tensor:
    """Per head, the largest scale·q·kᵀ over the batch and every (query, key) pair that `mask`
    allows, as `attend` computes it (q, k: (B, H, T, D); scale None = 1/√D), in fp32.

    Queries go in chunks of TRACK_CHUNK logits; each chunk multiplies only the band of keys
    its mask allows anywhere (causal: keys up to its last query; a window: the window), so a
    short window costs its band rather than the whole causal triangle.
    """
    B, H, T, D = q.shape
    scale = scale if scale is not None else D**-0.5
    rows = max(1, TRACK_CHUNK // (B * H * T))
    starts = range(0, T, rows)
    if mask is None:
        bands = [(0, min(s + rows, T)) for s in starts]
    else:
        # Every chunk's first and last allowed key first, then one host sync for all of them.
        ends = []
        for s in starts:
            seen = allowed_keys(mask, s, min(s + rows, T), 0, T, q.device).flatten(0, -2).any(0)
            ends += [seen.int().argmax(), T - seen.flip(0).int().argmax()]
        flat = torch.stack(ends).tolist()
        bands = list(zip(flat[::2], flat[1::2], strict=True))
    best = torch.full((H,), float("-inf"), dtype=torch.float32, device=q.device)
    with torch.autocast(q.device.type, enabled=False):  # fp32 logits, as attention's accumulators
        q, k = q.float(), k.float()
        for s, (lo, hi) in zip(starts, bands, strict=True):
            stop = min(s + rows, T)
            logits = q[:, :, s:stop] @ k[:, :, lo:hi].transpose(-1, -2) * scale
            ok = allowed_keys(mask, s, stop, lo, hi, q.device)
            logits.masked_fill_(~ok, float("-inf"))
            best = torch.maximum(best, logits.amax(dim=(0, 2, 3)))
    return best
