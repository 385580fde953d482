"""What each query may attend to: causal, within its document, within a sliding window.

Query position i may attend to key position j iff

    j ≤ i,  doc(j) = doc(i) (with document masking),  ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 (with a window),

where doc(p) counts the EOT tokens (50256) at positions ≤ p (an EOT opens a document and
belongs to it), b is the window's block size and N ≥ 1 its length in blocks: the query's own
block and the N−1 before it. Long-window layers use N = N(s) from the window schedule, short
ones max(1, ⌊N(s)/2⌋). One rule, two forms: a boolean mask for `scaled_dot_product_attention`
(CPU, small sequences) and a FlexAttention block mask (CUDA, where skipped blocks cost
nothing); both are built once per forward and shared by every layer of a kind.
"""

import torch
from torch import Tensor

EOT = 50256  # GPT-2's <|endoftext|>, which starts every document in our shards

Mask = Tensor | object  # a boolean (B, 1, T, T) tensor, or a FlexAttention BlockMask


def document_ids(idx: Tensor) -> Tensor:
    """doc(p) for every position of every row: the number of EOTs at or before p."""
    return (idx == EOT).cumsum(-1)


def window_lengths(window_blocks: Tensor) -> dict[str, Tensor]:
    """N for long and short layers from the schedule's N(s) (0 behaves as 1)."""
    long = window_blocks.clamp(min=1)
    return {"long": long, "short": (long // 2).clamp(min=1)}


def dense_mask(
    docs: Tensor | None, T: int, n_blocks: Tensor | None, block: int, device: torch.device
) -> Tensor:
    """The rule above as a boolean (B or 1, 1, T, T) mask, True where attention is allowed."""
    pos = torch.arange(T, device=device)
    q, kv = pos[:, None], pos[None, :]
    allowed = q >= kv
    if n_blocks is not None:
        allowed = allowed & (q // block - kv // block <= n_blocks - 1)
    allowed = allowed[None]
    if docs is not None:
        allowed = allowed & (docs[:, :, None] == docs[:, None, :])
    return allowed[:, None]


def flex_mask(
    docs: Tensor | None, B: int, T: int, n_blocks: Tensor | None, block: int, device: torch.device
) -> object:
    """The rule above as a FlexAttention `BlockMask` with `block`-sized tiles."""
    from torch.nn.attention.flex_attention import create_block_mask

    def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        ok = q >= kv
        if n_blocks is not None:
            ok = ok & (q // block - kv // block <= n_blocks - 1)
        if docs is not None:
            ok = ok & (docs[b, q] == docs[b, kv])
        return ok

    return create_block_mask(allowed, B, None, T, T, device=device, BLOCK_SIZE=block)


def build_masks(
    idx: Tensor, document: bool, kinds: set[str | None], window_blocks: Tensor | None, block: int
) -> dict[str | None, Mask] | None:
    """The masks one forward needs, by window kind ("long", "short", None = no window); None
    when plain causal attention covers everything (no document mask, no windows)."""
    if not document and kinds <= {None}:
        return None
    if kinds - {None} and window_blocks is None:
        raise ValueError("model.window is set but no window size was given to forward()")
    B, T = idx.shape
    docs = document_ids(idx) if document else None
    lengths = window_lengths(window_blocks) if window_blocks is not None else {}
    masks: dict[str | None, Mask] = {}
    for kind in kinds:
        n = lengths[kind] if kind is not None else None
        if idx.device.type == "cuda":
            masks[kind] = flex_mask(docs, B, T, n, block, idx.device)
        else:
            masks[kind] = dense_mask(docs, T, n, block, idx.device)
    return masks
