"""Paired-head attention (record_2026_07_17, #58; docs/records.md D.1 Attn_ℓ step 5, D.10 item 1):
head h and head h + H/2 share one head slot of the kernel over a sequence of twice the length.

For H heads (H even) and tokens t = 0 … T−1 of a (B, T, H, D) q, k or v:

    rotary   head h of token t is rotated at position 2t + (h mod 2): 2t for even heads, 2t+1
             for odd ones (the phase's parity is the head's);
    doubled  kernel position 2t + ⌊h / (H/2)⌋, slot h mod H/2: position 2t holds heads
             0 … H/2−1 of token t in slots 0 … H/2−1, position 2t+1 heads H/2 … H−1. This is
             the (B, T, H, D) tensor read as (B, 2T, H/2, D), a view; q, k and v (with its
             value embedding already added) alike;
    attend   causal over the 2T positions, within the token's document (2t and 2t+1 belong
             to it), window i − j ≤ W counted in doubled positions (≈ W/2 tokens), per slot;
    return   the output of slot s at 2t goes back to head s of token t, at 2t+1 to head
             s + H/2: the same view read backwards. Then the output gate and W_o as usual.

So head h attends to its partner h ± H/2 and itself: the query of head s (at 2t) sees the
slot's keys of earlier tokens only, the query of head s + H/2 (at 2t+1) also the key of head s
of its own token. record_2026_07_17 (H = 6): slots (0, 3), (1, 4), (2, 5). The rotation phase equals
the kernel position where h mod 2 = ⌊h / (H/2)⌋; for H/2 odd that is slots of even s, and the
slots of odd s have their two phases swapped within each token (H = 6: head 1 sits at 2t with
phase 2t+1, head 4 at 2t+1 with phase 2t). For H/2 even both heads of a slot share their
parity: slots of even s take 2t for both heads, odd s 2t+1 for both.

The attention scale (YaRN's too) is the normal layers' one; there is no key offset and no XSA
in a paired layer (model.attention.paired).
"""

import torch
from torch import Tensor


def paired_positions(T: int, n_head: int, device: torch.device) -> Tensor:
    """Rotary positions (T, n_head), fp32: 2t + (h mod 2) for head h of token t."""
    t = torch.arange(T, device=device, dtype=torch.float32)[:, None]
    parity = (torch.arange(n_head, device=device) % 2).to(torch.float32)[None, :]
    return 2 * t + parity


def double(z: Tensor) -> Tensor:
    """(B, T, H, D) per token and head → (B, H/2, 2T, D) per slot and kernel position."""
    B, T, H, D = z.shape
    return z.reshape(B, 2 * T, H // 2, D).transpose(1, 2)


def undouble(y: Tensor) -> Tensor:
    """(B, H/2, 2T, D) per slot and kernel position → (B, H, T, D) per head and token."""
    B, S, T2, D = y.shape
    return y.transpose(1, 2).reshape(B, T2 // 2, 2 * S, D).transpose(1, 2)
