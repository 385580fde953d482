"""Token-granular sliding windows (model.attention.window_granularity=token, the 2025-11 record):
i − j ≤ W tokens, in the block-level FlexAttention mask and the dense mask, against
`create_block_mask` on the rule written out from record_2025_11_29 (docs/records.md, C.1;
tests/unit/test_masks.py holds the block-granular rule's tests and the helpers shared here)."""

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from model.masks import EOT, block_mask, build_masks, dense_mask, document_ids, tile_structure
from tests.unit.test_masks import effective_mask, row, tile_sets


def token_windows(block: int) -> list[int]:
    """record_2025_11_29's windows (docs/records.md) around block boundaries, for blocks of 128: 1,
    127, 128, 129, 255 (the first to hold a tile whole), 300, 384, 640 and more than any length; the
    same places relative to a smaller block."""
    b = block
    return [0, 1, b - 1, b, b + 1, 2 * b - 1, 300 * b // 128, 3 * b, 5 * b, 10**6]


def token_rule(idx: Tensor, W: int) -> Callable:
    """The reference mask function, from record_2025_11_29 (docs/records.md, C.1): j ≤ i, same
    document, i − j ≤ W."""
    docs = (idx == EOT).cumsum(-1)

    def allowed(b: Tensor, h: Tensor, q: Tensor, kv: Tensor) -> Tensor:
        return (q >= kv) & (q - kv <= W) & (docs[b, q] == docs[b, kv])

    return allowed


def ours_tokens(idx: Tensor, W: int, block: int) -> BlockMask:
    tiles = tile_structure(document_ids(idx), idx.size(1), block, idx.device)
    return block_mask(tiles, idx.size(1), torch.tensor(W), block, token_window=True)


def token_rows(T: int, block: int) -> Tensor:
    """Two rows: documents shorter than a block, one longer than most windows, a start on a
    block boundary; and random documents."""
    gen = torch.Generator().manual_seed(T + block)
    fixed = [0, 3, block // 2, 2 * block, 2 * block + 5, T - block // 3]
    return torch.stack([row(T, fixed), row(T, torch.randint(0, T, (5,), generator=gen).tolist())])


@pytest.mark.parametrize(("T", "block"), [(1000, 128), (192, 16)])
def test_token_window_tiles_and_mask_equal_the_reference(T: int, block: int) -> None:
    """For every window: the same full and partial tiles as `create_block_mask` evaluating
    the token rule (up to the padded last query block, as above), kv lists nearest-first, and
    what a block-sparse kernel computes from tiles and mask function is the rule's mask."""
    idx = token_rows(T, block)
    B = idx.size(0)
    pos = torch.arange(T)
    for W in token_windows(block):
        mask = ours_tokens(idx, W, block)
        ref = create_block_mask(token_rule(idx, W), B, None, T, T, device="cpu", BLOCK_SIZE=block)
        (partial, full), (ref_partial, ref_full) = tile_sets(mask), tile_sets(ref)
        whole = slice(None) if T % block == 0 else slice(None, -1)
        assert torch.equal(partial[:, whole], ref_partial[:, whole]), W
        assert torch.equal(full[:, whole], ref_full[:, whole]), W
        assert torch.equal((partial | full)[:, -1], (ref_partial | ref_full)[:, -1]), W
        assert not (full & partial).any(), W
        for num, indices in [
            (mask.kv_num_blocks, mask.kv_indices),
            (mask.full_kv_num_blocks, mask.full_kv_indices),
        ]:
            steps = indices[..., 1:] - indices[..., :-1]
            assert (steps[torch.arange(1, indices.size(-1)) < num[..., None]] < 0).all(), W
            assert ((indices >= 0) & (indices < -(-T // block))).all(), W
        docs = (idx == EOT).cumsum(-1)
        q, kv = pos[:, None], pos[None, :]
        want = (q >= kv) & (q - kv <= W) & (docs[:, :, None] == docs[:, None, :])
        assert torch.equal(effective_mask(mask)[:, 0], want), W


@pytest.mark.parametrize(("T", "block", "windows"), [(640, 128, [129, 300]), (200, 16, [37])])
def test_token_window_attention_equals_the_reference_and_sdpa(
    T: int, block: int, windows: list[int]
) -> None:
    """flex_attention under our mask = under `create_block_mask`'s = SDPA with the rule's
    dense mask (and `dense_mask(token_window=True)` is that mask)."""
    idx = token_rows(T, block)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 1, T, 8, generator=gen) for _ in range(3))
    docs = (idx == EOT).cumsum(-1)
    pos = torch.arange(T)
    for W in windows:
        rule = (pos[:, None] >= pos) & (pos[:, None] - pos <= W)
        want = (rule & (docs[:, :, None] == docs[:, None, :]))[:, None]
        dense = dense_mask(document_ids(idx), T, torch.tensor(W), block, idx.device, True)
        assert torch.equal(dense, want), W
        ref = create_block_mask(token_rule(idx, W), 2, None, T, T, device="cpu", BLOCK_SIZE=block)
        got = flex_attention(q, k, v, block_mask=ours_tokens(idx, W, block))
        sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=want)
        torch.testing.assert_close(got, flex_attention(q, k, v, block_mask=ref))
        torch.testing.assert_close(got, sdpa, rtol=1e-5, atol=1e-5)


def test_build_masks_token_windows_by_kind() -> None:
    """token_window: the long and the short window W in tokens, dense and block forms
    alike; the full-tile lists stay shared, the block rule stays the default."""
    T, block = 200, 16
    idx = token_rows(T, block)
    kinds = {"long", "short", None}
    for long, short in [(80, 32), (112, 48), (37, 0)]:
        windows, short_w = torch.tensor(long), torch.tensor(short)
        flex = build_masks(idx, True, kinds, windows, block, "flex", True, short_w)
        sdpa = build_masks(idx, True, kinds, windows, block, "sdpa", True, short_w)
        assert flex["long"].full_kv_indices.data_ptr() == flex["short"].full_kv_indices.data_ptr()
        docs, pos = (idx == EOT).cumsum(-1), torch.arange(T)
        same_doc = (docs[:, :, None] == docs[:, None, :])[:, None]
        for kind, W in (("long", long), ("short", short), (None, 10**6)):
            ours_w = ours_tokens(idx, W, block)
            for a, b in zip(tile_sets(flex[kind]), tile_sets(ours_w), strict=True):
                assert torch.equal(a, b), kind
            rule = (pos[:, None] >= pos) & (pos[:, None] - pos <= W)
            assert torch.equal(sdpa[kind], rule & same_doc), kind
    # without document masking: the token rule alone, a float window taken as ⌊W⌋
    plain = build_masks(idx, False, {"long"}, torch.tensor(41.6), block, "flex", token_window=True)
    pos = torch.arange(T)
    want = (pos[:, None] >= pos) & (pos[:, None] - pos <= 41)  # ⌊41.6⌋ = 41
    assert torch.equal(effective_mask(plain["long"])[0, 0], want)
    blocks = build_masks(idx, True, kinds, torch.tensor(5), block, impl="sdpa")
    assert torch.equal(blocks["long"], dense_mask(document_ids(idx), T, torch.tensor(5), block,
                                                   idx.device))  # fmt: skip


def test_the_token_window_builder_traces_whole_without_recompiling() -> None:
    graphs = 0

    def counting(gm: torch.fx.GraphModule, example_inputs: list[Tensor]) -> object:
        nonlocal graphs
        graphs += 1
        return gm.forward

    def masks(idx: Tensor, window: Tensor) -> dict:
        return build_masks(idx, True, {"long", "short"}, window, 16, "flex", True, window // 2)

    compiled = torch.compile(masks, backend=counting, dynamic=False, fullgraph=True)
    idx = token_rows(200, 16)
    for window in (48, 128):
        got, want = compiled(idx, torch.tensor(window)), masks(idx, torch.tensor(window))
        for kind, mask in want.items():
            for a, b in zip(tile_sets(got[kind]), tile_sets(mask), strict=True):
                assert torch.equal(a, b), (window, kind)
    assert graphs == 1
