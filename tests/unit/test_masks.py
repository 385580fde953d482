"""The block-level FlexAttention mask builder against the token-level rule it replaces.

The reference is `create_block_mask` evaluated on every (query, key) pair of the rule in
`model/masks.py`; the builder must give the same full and partial tiles, kv lists
nearest-first, the same attention, and trace whole under `torch.compile`.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import (
    BlockMask,
    create_block_mask,
    create_mask,
    flex_attention,
)

from model.masks import EOT, block_mask, build_masks, dense_mask, document_ids, tile_structure

BLOCK = 32
WINDOWS = [None, *range(1, 15)]  # blocks; 14 is the record's final window

pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")


def token_level_block_mask(
    docs: Tensor | None, B: int, T: int, n_blocks: Tensor | None, block: int
) -> BlockMask:
    """The reference: the rule evaluated at all T² (query, key) pairs."""

    def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        ok = q >= kv
        if n_blocks is not None:
            ok = ok & (q // block - kv // block <= n_blocks - 1)
        if docs is not None:
            ok = ok & (docs[b, q] == docs[b, kv])
        return ok

    return create_block_mask(allowed, B, None, T, T, device="cpu", BLOCK_SIZE=block)


def effective_mask(mask: BlockMask) -> Tensor:
    """What a block-sparse kernel computes under `mask`, as a (B, 1, T, T) boolean mask:
    every element of a listed full tile, the mask function's elements of a listed partial
    tile, nothing elsewhere. (Eager flex_attention evaluates the mask function at every
    element and ignores the tiles, so eager outputs alone cannot check them.)"""
    partial, full = tile_sets(mask)
    (bq, bk), (Q, KV) = mask.BLOCK_SIZE, mask.seq_lengths

    def elements(tiles: Tensor) -> Tensor:
        return tiles.repeat_interleave(bq, 1).repeat_interleave(bk, 2)[:, :Q, :KV]

    rule = create_mask(mask.mask_mod, partial.size(0), 1, Q, KV, device="cpu")[:, 0]
    return (elements(full) | elements(partial) & rule)[:, None]


def without_window(mask: BlockMask, docs: Tensor | None) -> BlockMask:
    """`mask`'s tiles with the element-level rule reduced to document ∧ causal."""

    def document_causal(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (q >= kv) & (docs[b, q] == docs[b, kv]) if docs is not None else q >= kv

    return BlockMask.from_kv_blocks(
        mask.kv_num_blocks,
        mask.kv_indices,
        mask.full_kv_num_blocks,
        mask.full_kv_indices,
        BLOCK_SIZE=mask.BLOCK_SIZE,
        mask_mod=document_causal,
        seq_lengths=mask.seq_lengths,
    )


def row(T: int, eots: list[int]) -> Tensor:
    """A row of ordinary tokens with EOTs at `eots`."""
    idx = (torch.arange(T) * 7919) % 50000
    idx[eots] = EOT
    return idx


def batch(T: int, kind: str) -> Tensor:
    """Token rows whose documents cover the cases the tile rules distinguish."""
    gen = torch.Generator().manual_seed(T)
    rows = {
        # documents shorter than a block, one longer than the 14-block window, an EOT at 0
        "mixed": [row(T, [0, 10, 20, 40, 100, 621, 630])],
        "random": [row(T, torch.randint(0, T, (8,), generator=gen).tolist())],
        "no_eot": [row(T, [])],
        # documents starting exactly on block boundaries (no partial first block)
        "boundaries": [row(T, [0, BLOCK, 2 * BLOCK, 5 * BLOCK, 6 * BLOCK + 1])],
    }
    if kind == "two_rows":
        return torch.stack(rows["mixed"] + rows["random"])
    return torch.stack(rows[kind])


def tiles_of(num: Tensor, indices: Tensor) -> Tensor:
    """A (B, Q blocks, KV blocks) boolean matrix of the first `num` listed tiles per row."""
    listed = (torch.arange(indices.size(-1)) < num[..., None].long()).long()
    out = torch.zeros(indices.shape, dtype=torch.long)
    return out.scatter_add(-1, indices.long(), listed)[:, 0] > 0


def tile_sets(mask: BlockMask) -> tuple[Tensor, Tensor]:
    return (
        tiles_of(mask.kv_num_blocks, mask.kv_indices),
        tiles_of(mask.full_kv_num_blocks, mask.full_kv_indices),
    )


def ours(idx: Tensor, document: bool, n: int | None, block: int = BLOCK) -> BlockMask:
    docs = document_ids(idx) if document else None
    tiles = tile_structure(docs, idx.size(1), block, idx.device)
    return block_mask(tiles, idx.size(1), None if n is None else torch.tensor(n), block)


def reference(idx: Tensor, document: bool, n: int | None, block: int = BLOCK) -> BlockMask:
    docs = document_ids(idx) if document else None
    B, T = idx.shape
    return token_level_block_mask(docs, B, T, None if n is None else torch.tensor(n), block)


CASES = [
    (640, "two_rows", True),
    (700, "two_rows", True),
    (640, "no_eot", True),
    (700, "boundaries", True),
    (700, "random", True),
    (700, "two_rows", False),
]


@pytest.mark.parametrize(
    ("T", "kind", "document", "block"),
    [(*case, BLOCK) for case in CASES] + [(1000, "two_rows", True, 128)],
)
def test_tiles_equal_the_token_level_reference(
    T: int, kind: str, document: bool, block: int
) -> None:
    """Same full and same partial tiles per query block for every window, so the window
    clamp reproduces ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 exactly.

    One allowed difference: when T is not a multiple of the block, the reference sees the
    padded query positions as disallowed, so tiles of the last query block are partial there;
    ours pads with the last document, so some are full. Their union must still agree."""
    idx = batch(T, kind)
    for n in WINDOWS:
        (partial, full), (ref_partial, ref_full) = (
            tile_sets(ours(idx, document, n, block)),
            tile_sets(reference(idx, document, n, block)),
        )
        partial, full = partial.expand_as(ref_partial), full.expand_as(ref_full)
        whole = slice(None) if T % block == 0 else slice(None, -1)
        assert torch.equal(partial[:, whole], ref_partial[:, whole]), n
        assert torch.equal(full[:, whole], ref_full[:, whole]), n
        assert torch.equal((partial | full)[:, -1], (ref_partial | ref_full)[:, -1]), n
        assert not (full & partial).any()
        assert torch.equal(full[:, -1] & ref_full[:, -1], ref_full[:, -1]), n


@pytest.mark.parametrize(("T", "kind", "document"), CASES[:2] + CASES[-1:])
def test_kv_lists_are_nearest_first(T: int, kind: str, document: bool) -> None:
    """Within each counted prefix, kv block indices strictly descend: a window keeps a prefix."""
    idx = batch(T, kind)
    for n in WINDOWS:
        mask = ours(idx, document, n)
        for num, indices in [
            (mask.kv_num_blocks, mask.kv_indices),
            (mask.full_kv_num_blocks, mask.full_kv_indices),
        ]:
            steps = indices[..., 1:] - indices[..., :-1]
            counted = torch.arange(1, indices.size(-1)) < num[..., None]
            assert (steps[counted] < 0).all(), n


def test_the_window_clamp_around_a_documents_first_block() -> None:
    """A query block inside one document that began mid-block: with F full tiles behind it,
    N = F + 1 keeps only the diagonal partial tile, N = F + 2 also the document's first block;
    N = 0 behaves as 1."""
    idx = row(10 * BLOCK, [2 * BLOCK + 5])  # document 1 fills blocks 3-9 and part of block 2
    q_block, first = 9, 2
    F_tiles = q_block - first - 1  # full tiles: blocks 3..8
    for n, want_partial, want_full in [
        (F_tiles + 1, [9], [8, 7, 6, 5, 4, 3]),
        (F_tiles + 2, [9, 2], [8, 7, 6, 5, 4, 3]),
        (3, [9], [8, 7]),
        (0, [9], []),
        (1, [9], []),
    ]:
        mask = ours(idx[None], True, n)
        got_partial = mask.kv_indices[0, 0, q_block, : mask.kv_num_blocks[0, 0, q_block]]
        got_full = mask.full_kv_indices[0, 0, q_block, : mask.full_kv_num_blocks[0, 0, q_block]]
        assert got_partial.tolist() == want_partial, n
        assert got_full.tolist() == want_full, n


@pytest.mark.parametrize(
    ("T", "kind", "document", "windows"),
    [
        (640, "two_rows", True, [1, 3, None]),
        (700, "two_rows", True, [2, 14]),
        (700, "no_eot", False, [4]),
        (700, "two_rows", False, [1, None]),
    ],
)
def test_attention_equals_the_reference_and_sdpa(
    T: int, kind: str, document: bool, windows: list[int | None]
) -> None:
    """flex_attention under our mask = under the reference mask = SDPA with the dense mask,
    also for a length that is not a multiple of the block and a broadcast batch row. On CPU
    flex_attention runs eagerly and applies the mask function everywhere: this checks that
    function and that the padded lengths are accepted; the tiles are checked by
    `test_what_the_kernel_computes_is_the_dense_mask` and on CUDA by the compiled kernel."""
    idx = batch(T, kind)
    B = idx.size(0)
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, 2, T, 16, generator=gen) for _ in range(3))
    docs = document_ids(idx) if document else None
    for n in windows:
        window = None if n is None else torch.tensor(n)
        got = flex_attention(q, k, v, block_mask=ours(idx, document, n))
        ref = flex_attention(q, k, v, block_mask=reference(idx, document, n))
        sdpa = F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask(docs, T, window, BLOCK, idx.device)
        )
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, sdpa, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("T", "kind", "document"), CASES[:2] + CASES[-1:])
def test_what_the_kernel_computes_is_the_dense_mask(T: int, kind: str, document: bool) -> None:
    """Tiles plus mask function, read as a block-sparse kernel reads them, give exactly
    `dense_mask` for every window; also with a document-causal mask function, so the window
    is done entirely by the clamp (the window term in ours only serves per-element readers)."""
    idx = batch(T, kind)
    docs = document_ids(idx) if document else None
    for n in WINDOWS:
        window = None if n is None else torch.tensor(n)
        want = dense_mask(docs, T, window, BLOCK, idx.device)
        mask = ours(idx, document, n)
        padded = tile_structure(docs, T, BLOCK, idx.device).docs
        for got in (effective_mask(mask), effective_mask(without_window(mask, padded))):
            assert torch.equal(got.expand_as(want), want), n


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the block-sparse kernel needs CUDA")
@pytest.mark.parametrize("T", [2048, 2000])
def test_compiled_flex_attention_on_cuda_equals_sdpa(T: int) -> None:
    """The real kernel, which skips unlisted tiles and leaves full ones unmasked; block and
    token windows."""
    idx = torch.stack([row(T, [0, 10, 300, 301, 1100]), row(T, [])]).cuda()
    docs = document_ids(idx)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(2, 2, T, 64, generator=gen, device="cuda") for _ in range(3))
    attend = torch.compile(flex_attention, dynamic=False)
    tiles = tile_structure(docs, T, 128, idx.device)
    for n in (1, 3, None):
        window = None if n is None else torch.tensor(n, device="cuda")
        mask = block_mask(tiles, T, window, 128)
        want = F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask(docs, T, window, 128, idx.device)
        )
        # loose enough for TF32 either side; a wrong tile moves outputs by O(0.1)
        torch.testing.assert_close(attend(q, k, v, block_mask=mask), want, rtol=2e-3, atol=2e-3)
    for W in (1, 129, 300, 640):  # token windows: the kernel must mask the tiles they cut
        window = torch.tensor(W, device="cuda")
        mask = block_mask(tiles, T, window, 128, token_window=True)
        want = F.scaled_dot_product_attention(
            q, k, v, attn_mask=dense_mask(docs, T, window, 128, idx.device, token_window=True)
        )
        torch.testing.assert_close(attend(q, k, v, block_mask=mask), want, rtol=2e-3, atol=2e-3)


def test_build_masks_chooses_the_form_and_shares_the_tiles() -> None:
    idx = batch(640, "two_rows")
    kinds, window = {"long", "short", None}, torch.tensor(6)
    flex = build_masks(idx, True, kinds, window, BLOCK, impl="flex")
    assert all(isinstance(m, BlockMask) for m in flex.values())
    # one tile structure: the long and short masks differ only in their counts
    assert flex["long"].kv_indices.data_ptr() == flex["short"].kv_indices.data_ptr()
    sdpa = build_masks(idx, True, kinds, window, BLOCK, impl="sdpa")
    auto = build_masks(idx, True, kinds, window, BLOCK)
    for kind in kinds:
        assert isinstance(sdpa[kind], Tensor) and torch.equal(auto[kind], sdpa[kind])
    with pytest.raises(ValueError, match="unknown mask implementation"):
        build_masks(idx, True, kinds, window, BLOCK, impl="triton")


def test_the_builder_traces_whole_and_a_new_window_does_not_recompile() -> None:
    """fullgraph tracing (no graph break, no host sync) gives the eager masks; a new window
    value and new document positions reuse the one compiled graph."""
    graphs = 0

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> object:
        nonlocal graphs
        graphs += 1
        return gm.forward

    def masks(idx: Tensor, window: Tensor) -> dict:
        return build_masks(idx, True, {"long", "short", None}, window, BLOCK, impl="flex")

    compiled = torch.compile(masks, backend=counting, dynamic=False, fullgraph=True)
    idx = batch(700, "two_rows")
    for window in (3, 11):
        got, want = compiled(idx, torch.tensor(window)), masks(idx, torch.tensor(window))
        for kind, mask in want.items():
            assert got[kind].seq_lengths == mask.seq_lengths
            for a, b in zip(tile_sets(got[kind]), tile_sets(mask), strict=True):
                assert torch.equal(a, b), (window, kind)
        idx = batch(700, "random").expand(2, -1).clone()
    assert graphs == 1
