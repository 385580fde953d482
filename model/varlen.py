"""Attention through a varlen flash kernel (model.attention.impl=varlen): the rows of a batch and
the documents in them as the segments of one packed sequence, the window as the kernel's own.

The kernel (`torch.nn.attention.varlen.varlen_attn`, CUDA) takes q, k, v as (N, H, D) over the
N = B·T positions of the batch read as one sequence, and `cu_seqlens`, the segments' cumulative
bounds 0 = c₀ ≤ c₁ ≤ … ≤ c_S = N. With `window_size = (W, 0)` query i attends to key j iff

    c_s ≤ j ≤ i < c_(s+1) for one segment s,  and  i − j ≤ W   (W = −1: no window),

which is `model/masks.py`'s rule when a segment starts at every row start and every EOT (an
EOT opens a document and belongs to it; empty segments, two equal bounds, hold nothing). The
paired-head layers (model/paired.py) attend over 2T positions a row: the bounds doubled, the
window counted in doubled positions.

Shapes stay static, so a compiled model neither syncs nor recompiles within a stage:
`cu_seqlens` always has `capacity` + 1 entries, the starts found on the device
(`nonzero_static`) and the unused tail filled with N (empty segments, as the record pads its
cu_seqlens with repeats of L). More segments than `capacity` fail on the device
(`_assert_async`) rather than merge documents; the capacity is B rows times the stage's
train.stages.rows.N.max_pieces (each row starts a piece) where it is set, else times
model.attention.max_segments: record #89's one row of 63 / 95 / 127 pieces gives its 64 / 96
/ 128 entries. The window, the attention scale (YaRN's of the stage), the segments a row and
the longest segment are
Python numbers of the step (`KernelStep`), as the kernel takes them: a compiled model
(dynamic=False) compiles once per distinct step, and these change only with the stage.
"""

import inspect
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from model.config.kernel_step import KernelStep
from model.masks import EOT

__all__ = ["KernelStep"]


class Segments(NamedTuple):
    """One window kind's varlen mask: the bounds, the longest segment, the window."""

    cu_seqlens: Tensor  # (capacity + 1,) int32 over the batch read as one sequence
    max_len: int
    window: int  # W, −1 for none


def segment_bounds(idx: Tensor, document: bool, capacity: int) -> Tensor:
    """cu_seqlens (capacity + 1,) int32 for the (B, T) tokens `idx`: a segment starts at every
    row start and, with `document`, at every EOT; the tail repeats B·T. Fails on the device
    when the batch holds more than `capacity` segments."""
    B, T = idx.shape
    starts = torch.zeros(B, T, dtype=torch.bool, device=idx.device)
    starts[:, 0] = True
    if document:
        starts = starts | (idx == EOT)
    flat = starts.flatten()
    torch._assert_async(
        flat.sum() <= capacity,
        "varlen attention: more segments (documents and rows) in the batch than cu_seqlens "
        "has room for: raise train.stages.rows.N.max_pieces or model.attention.max_segments",
    )
    found = torch.nonzero_static(flat, size=capacity, fill_value=B * T).flatten()
    end = torch.full((1,), B * T, dtype=found.dtype, device=idx.device)
    return torch.cat([found, end]).to(torch.int32)


def varlen_masks(
    idx: Tensor,
    document: bool,
    kinds: set[str | None],
    paired: frozenset[str | None],
    windows: dict[str | None, int],
    capacity: int,
    max_len: int,
) -> dict[str | None, Segments]:
    """The varlen masks of one forward, keyed as `model/masks.py`'s `build_masks` keys its
    own: one set of bounds for every layer, doubled for the paired layers (each token's two
    positions belong to its segment), with each kind's window W (−1: none); `max_len` ≤ T."""
    from model.masks import paired_key

    cu = segment_bounds(idx, document, capacity)
    masks = {kind: Segments(cu, max_len, windows[kind]) for kind in kinds}
    for kind in paired:
        masks[paired_key(kind)] = Segments(cu * 2, 2 * max_len, windows[kind])
    return masks


def varlen_kernel() -> Callable:
    """torch's varlen flash attention (`varlen_support` says whether this build has it)."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn


def varlen_support(device: torch.device) -> str | None:
    """Why the varlen kernel cannot run on `device` with this torch, None where it can."""
    if device.type != "cuda":
        return f"it runs on CUDA only, and this run is on {device.type}"
    try:
        kernel = varlen_kernel()
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen"
    params = inspect.signature(kernel).parameters
    if not {"window_size", "scale"} <= params.keys():
        return (
            f"torch {torch.__version__}'s varlen_attn takes no window_size or scale "
            "(a newer torch has them)"
        )
    return None


def attend_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    segments: Segments,
    scale: float | None,
    kernel: Callable | None = None,
) -> Tensor:
    """softmax(scale·q·kᵀ + the segments' rule)·v for (B, H, T, D) q, k, v; `kernel`: the
    varlen kernel (default torch's; the tests hand in `emulated_varlen_attn`)."""
    B, H, T, D = q.shape

    def packed(z: Tensor) -> Tensor:  # (B, H, T, D) → (B·T, H, D): a view where z came
        return z.transpose(1, 2).reshape(B * T, H, D)  # from a (B, T, H, D) tensor

    cu = segments.cu_seqlens
    y = (kernel or varlen_kernel())(
        packed(q), packed(k), packed(v), cu, cu, segments.max_len, segments.max_len,
        scale=scale, window_size=(segments.window, 0),
    )  # fmt: skip
    return y.reshape(B, T, H, D).transpose(1, 2)


def segments_mask(cu_seqlens: Tensor, n: int, window: int) -> Tensor:
    """The kernel's rule (module docstring) as a dense (n, n) boolean mask, True where query i
    may attend to key j: computed from the bounds alone, the reference for `segment_bounds`."""
    pos = torch.arange(n, device=cu_seqlens.device)
    seg = torch.searchsorted(cu_seqlens.long(), pos, right=True)  # s + 1 for c_s ≤ p < c_(s+1)
    q, kv = pos[:, None], pos[None, :]
    allowed = (seg[:, None] == seg[None, :]) & (kv <= q)
    return allowed & (q - kv <= window) if window >= 0 else allowed


def emulated_varlen_attn(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seq_q: Tensor,
    cu_seq_k: Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
) -> Tensor:
    """`varlen_attn`'s documented semantics for causal windows (right = 0) on any device, by
    a dense mask and SDPA: the CPU stand-in the tests check the plumbing with. Also checks
    what the kernel would: equal q and k bounds, no segment longer than max_q."""
    assert torch.equal(cu_seq_q, cu_seq_k) and max_q == max_k
    assert window_size[1] == 0, "the model's windows are causal"
    longest = int((cu_seq_q[1:] - cu_seq_q[:-1]).max())
    assert longest <= max_q, f"a segment of {longest} tokens, max_q {max_q}"
    n = query.size(0)
    mask = segments_mask(cu_seq_q, n, window_size[0])
    q, k, v = (z.transpose(0, 1)[None] for z in (query, key, value))  # (1, H, N, D)
    y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return y[0].transpose(0, 1)
