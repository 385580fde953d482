"""What each query may attend to: causal, within its document, within a sliding window.

Query position i may attend to key position j iff

    j ≤ i,  doc(j) = doc(i) (with document masking),  ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 (with a window),

where doc(p) counts the EOT tokens (50256) at positions ≤ p (an EOT opens a document and
belongs to it), b is the window's block size and N ≥ 1 its length in blocks: the query's own
block and the N−1 before it. Long-window layers use N = N(s) from the window schedule, short
ones max(1, ⌊N(s)/2⌋). With `token_window` (the 2025-11 record) the window is token-granular
instead: i − j ≤ W for a window of W tokens (W = b·N long, b·n short), so every query sees the
same number of keys behind it wherever it sits in its block. One rule, two forms: a boolean
mask for `scaled_dot_product_attention` (CPU, small sequences) and a FlexAttention block mask
(CUDA, where skipped blocks cost nothing); both are built once per forward and shared by
every layer of a kind.

The block mask is built from per-block document bounds rather than by evaluating the rule at
every (query, key) pair: O((T/b)²) tensor work, free of host syncs and traceable whole by
`torch.compile`. With tiles of the window's block size b, each query block lists its *full*
kv tiles (allowed everywhere, no per-element mask) and *partial* ones (masked per element)
nearest-first; a window then just keeps a prefix of each list (see `block_mask`), so the
long and short masks share everything but that clamp. A token window cuts up to two kv tiles
per query block that the document rule leaves full; those become partial, and each window
builds its own partial list, by arithmetic on per-block counts (`_token_window_lists`).
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


def _whole_tokens(window: Tensor) -> Tensor:
    """A token window W as whole tokens, ≥ 0: i − j ≤ W for a fractional W is i − j ≤ ⌊W⌋."""
    whole = window.floor() if window.is_floating_point() else window
    return whole.long().clamp(min=0)


def dense_mask(
    docs: Tensor | None,
    T: int,
    n_blocks: Tensor | None,
    block: int,
    device: torch.device,
    token_window: bool = False,
) -> Tensor:
    """The rule above as a boolean (B or 1, 1, T, T) mask, True where attention is allowed;
    with `token_window`, `n_blocks` is the window W in tokens."""
    pos = torch.arange(T, device=device)
    q, kv = pos[:, None], pos[None, :]
    allowed = q >= kv
    if n_blocks is not None and token_window:
        allowed = allowed & (q - kv <= _whole_tokens(n_blocks))
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
    first: Tensor  # (B, blocks) the first kv block sharing a document with each query block


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
    shared = hi[:, None, :] >= lo[:, :, None]  # kv blocks from the query block's first document on
    partial = (q >= kv) & shared & ~full
    (n_partial, partial_idx), (n_full, full_idx) = _nearest_first(partial), _nearest_first(full)
    first = (~shared).sum(-1)  # hi never decreases: the kv blocks sharing none come first
    padded_docs = padded if docs is not None else None
    return Tiles(padded_docs, n_partial, partial_idx, n_full, full_idx, first)


def _rule(
    docs: Tensor | None, n_blocks: Tensor | None, block: int, token_window: bool = False
) -> Callable:
    """The module's rule per element, the mask function of partial tiles. The block window's
    term never changes attention (the clamp already drops every tile outside the window) but
    keeps the function a complete description of the mask for code that reads it per
    element (QK-clip's max-logit tracking); a token window's term masks the tiles it cuts."""

    def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        ok = q >= kv
        if n_blocks is not None and token_window:
            ok = ok & (q - kv <= n_blocks)
        elif n_blocks is not None:
            ok = ok & (q // block - kv // block <= n_blocks - 1)
        if docs is not None:
            ok = ok & (docs[b, q] == docs[b, kv])
        return ok

    return allowed


def _token_window_lists(tiles: Tiles, w: Tensor, block: int) -> tuple[Tensor, Tensor, Tensor]:
    """Partial counts, partial kv lists and full counts under a window of `w` tokens.

    For query block q and kv block k ≤ q the distances i − j span (q−k)·b − (b−1) … (q−k)·b +
    b − 1 (from 0 on the diagonal), so the window holds a tile whole iff q − k ≤ f = ⌊(W+1)/b⌋
    − 1 and touches it iff q − k ≤ r = ⌈W/b⌉. The tiles sharing a document with the query
    block are the run first … q, and its full tiles the run q−F … q−1 (F ≥ 1 only for a query
    block inside one document), so under the window the full tiles are the first min(F, f) of
    the nearest-first list and the partial ones q, then q − min(F, f) − 1 down to
    max(first, q − r): two runs, written down without a sort.
    """
    full = torch.minimum(tiles.full, ((w + 1) // block - 1).clamp(min=0))
    reach = (w + block - 1) // block
    blocks = tiles.full.size(-1)
    q = torch.arange(blocks, device=w.device)
    lowest = torch.maximum(tiles.first, q - reach)
    partial = 1 + (q - full - lowest).clamp(min=0)
    rank = torch.arange(blocks, device=w.device)
    idx = torch.where(rank == 0, q[:, None], q[:, None] - full[..., None] - rank)
    # the tail past each count is never read; keep it a valid block index all the same
    return partial.to(torch.int32), (idx % blocks).to(torch.int32), full.to(torch.int32)


def block_mask(
    tiles: Tiles, T: int, n_blocks: Tensor | None, block: int, token_window: bool = False
) -> object:
    """The rule as a FlexAttention `BlockMask` with a window of N = `n_blocks` (a 0-d tensor,
    so a growing window neither recompiles nor syncs; None: no window), or with
    `token_window` a window of W = `n_blocks` tokens (also 0-d).

    A block window only clamps the nearest-first lists: at most N−1 full tiles and
    max(1, N − F) partial ones (F: full tiles before clamping). This is the window rule
    exactly: a query block inside one document has its full tiles right behind it and partial
    tiles only on the diagonal and at its document's first block; one spanning documents has
    no full tiles and a contiguous run of partial ones. A token window clamps the full list
    the same way and writes its own partial list (`_token_window_lists`).
    """
    from torch.nn.attention.flex_attention import BlockMask

    partial, partial_idx, full = tiles.partial, tiles.partial_idx, tiles.full
    if n_blocks is not None and token_window:
        n = _whole_tokens(n_blocks)
        partial, partial_idx, full = _token_window_lists(tiles, n, block)
    elif n_blocks is not None:
        n = n_blocks.clamp(min=1)
        partial = torch.minimum(partial, (n - full).clamp(min=1)).to(torch.int32)
        full = torch.minimum(full, n - 1).to(torch.int32)
    else:
        n = None
    return BlockMask.from_kv_blocks(
        partial[:, None].contiguous(),
        partial_idx[:, None].contiguous(),
        full[:, None].contiguous(),
        tiles.full_idx[:, None].contiguous(),
        BLOCK_SIZE=block,
        mask_mod=_rule(tiles.docs, n, block, token_window),
        seq_lengths=(T, T),
    )


def build_masks(
    idx: Tensor,
    document: bool,
    kinds: set[str | None],
    window_blocks: Tensor | dict[str, Tensor] | None,
    block: int,
    impl: str = "auto",
    token_window: bool = False,
    short_window: Tensor | None = None,
    paired: frozenset[str | None] = frozenset(),
) -> dict[str | None, Mask] | None:
    """The masks one forward needs, by window kind ("long", "short", None = no window); None
    when plain causal attention covers everything (no document mask, no windows).

    `paired`: the window kinds of the paired-head layers (model/paired.py), whose masks are
    the same rule over the doubled sequence of 2T positions (position 2t and 2t+1 in token
    t's document; windows counted in doubled positions), keyed by `paired_key(kind)`.

    `window_blocks`: without `token_window`, the long window N in blocks (short: `window_lengths`)
    or each kind's N ({"long": N, "short": n}, for a short window that is not ⌊N/2⌋). With
    `token_window` (model.attention.window_granularity=token) the windows are token-granular,
    i − j ≤ W:
    `window_blocks` is the long W in tokens and `short_window` the short one (0-d tensors).
    `impl`: "sdpa" for dense boolean masks, "flex" for block masks, "auto" for flex on CUDA
    and sdpa elsewhere. Block masks share one tile structure; only the window's lists differ.
    """
    if not document and (kinds | paired) <= {None}:
        return None
    if (kinds | paired) - {None} and window_blocks is None:
        raise ValueError("model.attention.window is set but no window size was given to forward()")
    if impl == "auto":
        impl = "flex" if idx.device.type == "cuda" else "sdpa"
    if impl not in ("sdpa", "flex"):
        raise ValueError(f"unknown mask implementation {impl!r}: expected sdpa, flex or auto")
    T = idx.size(1)
    docs = document_ids(idx) if document else None
    if token_window:
        if "short" in kinds | paired and short_window is None:
            raise ValueError(
                "model.attention.window_granularity=token: short-window layers need the forward's "
                "short_window_tokens"
            )
        lengths = {"long": window_blocks, "short": short_window}
    elif isinstance(window_blocks, dict):
        lengths = {kind: n.clamp(min=1) for kind, n in window_blocks.items()}
    else:
        lengths = window_lengths(window_blocks) if window_blocks is not None else {}
    masks: dict[str | None, Mask] = {}
    for keys, length, ids in (
        ({kind: kind for kind in kinds}, T, docs),
        # a token's two positions both belong to its document
        ({paired_key(kind): kind for kind in paired}, 2 * T, _doubled(docs)),
    ):
        tiles = tile_structure(ids, length, block, idx.device) if impl == "flex" and keys else None
        for key, kind in keys.items():
            n = lengths[kind] if kind is not None else None
            if tiles is not None:
                masks[key] = block_mask(tiles, length, n, block, token_window)
            else:
                masks[key] = dense_mask(ids, length, n, block, idx.device, token_window)
    return masks


def paired_key(kind: str | None) -> str:
    """The key of the paired-head layers' mask of window kind `kind` in `build_masks`'s dict."""
    return "paired" if kind is None else f"paired_{kind}"


def _doubled(docs: Tensor | None) -> Tensor | None:
    """doc ids over the doubled sequence: positions 2t and 2t+1 take token t's."""
    return None if docs is None else docs.repeat_interleave(2, dim=-1)
