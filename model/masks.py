"""What each query may attend to: causal, within its document, within a sliding window.

Query position i may attend to key position j iff

    j ≤ i,  doc(j) = doc(i) (with document masking),  ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 (with a window),

where doc(p) counts the EOT tokens (50256) at positions ≤ p (an EOT opens a document and
belongs to it), b is the window's block size and N ≥ 1 its length in blocks: the query's own
block and the N−1 before it. Long-window layers use N = N(s) from the window schedule, short
ones max(1, ⌊N(s)/2⌋). With token windows (model.window_granularity=token, the 2025-11
record) the window term is i − j ≤ W instead, W a number of tokens (W + 1 keys with the query):
long layers the schedule's `window_tokens`, short ones its `short_window_tokens`. One rule,
two forms: a boolean mask for `scaled_dot_product_attention` (CPU, small sequences) and a
FlexAttention block mask (CUDA, where skipped blocks cost nothing); both are built once per
forward and shared by every layer of a kind.

The block mask is built from per-block document bounds rather than by evaluating the rule at
every (query, key) pair: O((T/b)²) tensor work, free of host syncs and traceable whole by
`torch.compile`. With tiles of the window's block size b, each query block lists its *full*
kv tiles (allowed everywhere, no per-element mask) and *partial* ones (masked per element)
nearest-first; a window then just keeps a prefix of each list (see `block_mask`), so the
long and short masks share everything but that clamp.
"""

from collections.abc import Callable
from typing import NamedTuple

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
    docs: Tensor | None,
    T: int,
    n_blocks: Tensor | None,
    block: int,
    device: torch.device,
    token_window: bool = False,
) -> Tensor:
    """The rule above as a boolean (B or 1, 1, T, T) mask, True where attention is allowed.
    `token_window`: `n_blocks` is a window W in tokens (i − j ≤ W), not in blocks."""
    pos = torch.arange(T, device=device)
    q, kv = pos[:, None], pos[None, :]
    allowed = q >= kv
    if n_blocks is not None and token_window:
        allowed = allowed & (q - kv <= n_blocks)
    elif n_blocks is not None:
        allowed = allowed & (q // block - kv // block <= n_blocks - 1)
    allowed = allowed[None]
    if docs is not None:
        allowed = allowed & (docs[:, :, None] == docs[:, None, :])
    return allowed[:, None]


class Tiles(NamedTuple):
    """The window-independent tile structure of one forward, shared by its long and short
    masks: per query block, the candidate kv blocks of each kind, nearest-first."""

    docs: Tensor | None  # (B, blocks·b) doc ids padded to whole blocks (None: one document)
    partial: Tensor  # (B, blocks) how many partial tiles each query block has
    partial_idx: Tensor  # (B, blocks, blocks) their kv block indices, nearest-first
    full: Tensor  # (B, blocks) how many full tiles
    full_idx: Tensor  # (B, blocks, blocks)


def _nearest_first(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """Count and kv block indices (descending, so a window keeps a prefix) of a (B, Q, KV)
    boolean tile matrix; the unused tail of each row holds the other indices."""
    kv = torch.arange(tiles.size(-1), device=tiles.device)
    key = torch.where(tiles, kv, -1)
    order = key.sort(dim=-1, descending=True, stable=True).indices
    return tiles.sum(-1, dtype=torch.int32), order.to(torch.int32)


def tile_structure(docs: Tensor | None, T: int, block: int, device: torch.device) -> Tiles:
    """Full and partial tiles of the document-causal rule from per-block document bounds,
    O((T/b)²) work where a token-level mask function costs O(T²).

    A kv tile is full when it lies strictly before the query tile and both lie wholly in one
    document; partial when it is at or before the query tile, shares a document with it and
    is not full. Lengths that are not a multiple of b are padded with the last doc id, so the
    padding opens no document and the mask function can index every padded position.
    """
    ids = docs if docs is not None else torch.zeros(1, T, dtype=torch.long, device=device)
    blocks = -(-T // block)
    pad = ids[:, -1:].expand(-1, blocks * block - T)
    padded = torch.cat([ids, pad], 1)
    # doc ids never decrease along a row, so a block's first and last ids are its bounds
    lo, hi = padded[:, ::block], padded[:, block - 1 :: block]
    pos = torch.arange(blocks, device=device)
    q, kv = pos[:, None], pos[None, :]  # (query block, kv block) pairs
    # With kv before q and ids non-decreasing, lo_kv ≤ hi_kv ≤ lo_q ≤ hi_q: one shared document
    # means hi_kv ≥ lo_q, and both tiles wholly inside it means lo_kv = hi_q.
    full = (q > kv) & (lo[:, None, :] == hi[:, :, None])
    partial = (q >= kv) & (hi[:, None, :] >= lo[:, :, None]) & ~full
    (n_partial, partial_idx), (n_full, full_idx) = _nearest_first(partial), _nearest_first(full)
    return Tiles(padded if docs is not None else None, n_partial, partial_idx, n_full, full_idx)


def _rule(docs: Tensor | None, n_blocks: Tensor | None, block: int) -> Callable:
    """The module's rule per element, the mask function of partial tiles. The window term
    never changes attention (the clamp already drops every tile outside the window) but
    keeps the function a complete description of the mask for code that reads it per
    element (QK-clip's max-logit tracking)."""

    def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        ok = q >= kv
        if n_blocks is not None:
            ok = ok & (q // block - kv // block <= n_blocks - 1)
        if docs is not None:
            ok = ok & (docs[b, q] == docs[b, kv])
        return ok

    return allowed


def block_mask(tiles: Tiles, T: int, n_blocks: Tensor | None, block: int) -> object:
    """The rule as a FlexAttention `BlockMask` with a window of N = `n_blocks` (a 0-d tensor,
    so a growing window neither recompiles nor syncs; None: no window).

    The window only clamps the nearest-first lists: at most N−1 full tiles and max(1, N − F)
    partial ones (F: full tiles before clamping). This is the window rule exactly: a query
    block inside one document has its full tiles right behind it and partial tiles only on
    the diagonal and at its document's first block; one spanning documents has no full tiles
    and a contiguous run of partial ones.
    """
    from torch.nn.attention.flex_attention import BlockMask

    partial, full = tiles.partial, tiles.full
    n = n_blocks.clamp(min=1) if n_blocks is not None else None
    if n is not None:
        partial = torch.minimum(partial, (n - full).clamp(min=1)).to(torch.int32)
        full = torch.minimum(full, n - 1).to(torch.int32)
    return BlockMask.from_kv_blocks(
        partial[:, None].contiguous(),
        tiles.partial_idx[:, None].contiguous(),
        full[:, None].contiguous(),
        tiles.full_idx[:, None].contiguous(),
        BLOCK_SIZE=block,
        mask_mod=_rule(tiles.docs, n, block),
        seq_lengths=(T, T),
    )


def build_masks(
    idx: Tensor,
    document: bool,
    kinds: set[str | None],
    window_blocks: Tensor | None,
    block: int,
    impl: str = "auto",
    token_window: bool = False,
    short_window: Tensor | None = None,
) -> dict[str | None, Mask] | None:
    """The masks one forward needs, by window kind ("long", "short", None = no window); None
    when plain causal attention covers everything (no document mask, no windows).

    `impl`: "sdpa" for dense boolean masks, "flex" for block masks, "auto" for flex on CUDA
    and sdpa elsewhere. Block masks share one tile structure; only the window clamp differs.
    `token_window`: `window_blocks` is the long window W in tokens and `short_window` the
    short one (both 0-d tensors), under the rule i − j ≤ W.
    """
    if not document and kinds <= {None}:
        return None
    if kinds - {None} and window_blocks is None:
        raise ValueError("model.window is set but no window size was given to forward()")
    if impl == "auto":
        impl = "flex" if idx.device.type == "cuda" else "sdpa"
    if impl not in ("sdpa", "flex"):
        raise ValueError(f"unknown mask implementation {impl!r}: expected sdpa, flex or auto")
    T = idx.size(1)
    docs = document_ids(idx) if document else None
    lengths = window_lengths(window_blocks) if window_blocks is not None else {}
    if token_window:
        if "short" in kinds and short_window is None:
            raise ValueError(
                "model.window_granularity=token: short-window layers need the forward's "
                "short_window_tokens"
            )
        lengths = {"long": window_blocks, "short": short_window}
    tiles = tile_structure(docs, T, block, idx.device) if impl == "flex" else None
    masks: dict[str | None, Mask] = {}
    for kind in kinds:
        n = lengths[kind] if kind is not None else None
        if tiles is not None and token_window:  # tokens: the block-mask builder's flag
            masks[kind] = block_mask(tiles, T, n, block, token_window=True)
        elif tiles is not None:
            masks[kind] = block_mask(tiles, T, n, block)
        else:
            masks[kind] = dense_mask(docs, T, n, block, idx.device, token_window)
    return masks
