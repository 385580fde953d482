"""Record D's FP8 up projection and what follows it (model/mlp_fp8.py) as one Triton kernel:
the e4m3 GEMM, its scales, ReLU² and the down projection's e4m3 quantisation of post, in one
launch that writes every result of the tile it computes.

With n₈ (T×d, e4m3) the quantised normed input, W₈ = c_fc₈ (4d×d, e4m3, (out, in)), the fp32
scalars a_scale = a/448 and s_up (a bf16 value) of mlp_fp8.py's forward, and the delayed scale
s_act (fp32) of its down projection:

    acc  = n₈·W₈ᵀ                             exact e4m3 products, fp32 sums
    pre  = bf16(acc·fp32(a_scale·s_up))       the two scales' fp32 product, then one rounding
    post = bf16(ReLU(pre)²)                   the bf16 pre, squared in fp32 (exact), rounded once
    post₈ = e4m3(min(fp32(post/s_act), 448))  correctly rounded quotient, clamped, then cast
    tile_max[i, j] = max of post over output tile (i, j)

Every rounding is to nearest, ties to even. They are mlp_fp8.py's, in its order: scaled_mm
(model/fp8.py) multiplies the fp32 sums by the product of the scales and rounds to bf16 once;
F.relu(pre).square() squares the bf16 pre (8 significant bits: the fp32 square is exact) and
rounds once, so ReLU² has no second rounding to place; `_e4m3(post.float() / s_act, 448)`
divides in fp32 and clamps before the cast. The layer's max post is `tile_max.amax()` (a NaN
post makes its tile's maximum NaN, as torch's amax).

Where it differs from mlp_fp8.py's path, and why:
- One launch instead of four passes (`torch._scaled_mm`, ReLU², the amax, the e4m3 cast): pre
  is rounded to bf16 in registers and post, post₈ and the maxima come from it there, so post is
  never read back from memory to be squared, divided, cast or reduced.
- The fp32 sums: the tile's products are summed in K-blocks of `block_k` (tl.dot on the e4m3
  tiles, accumulating into an fp32 accumulator), in another order than cuBLAS or the CPU
  emulation's fp32 matmul, so where a sum is not exact in fp32 its last bit can differ, which
  moves pre across a bf16 rounding boundary rarely (the bound: tests/unit/test_triton_mlp.py).
  On Hopper the tensor cores' own FP8 accumulation keeps fewer bits than fp32, and Triton's
  default there lets it run over the whole sum; the kernel adds the partial sums into its
  fp32 accumulator after every K-block instead (tl.dot's max_num_imprecise_acc = block_k),
  the kind of promotion cuBLAS makes without fast accumulation (the up projection's
  `use_fast_accum=False`; cuBLAS does not document its interval, so the two can differ in
  more than the order of the sums there: scripts/bench/mlp_kernel.py measures it).
- The bf16 and e4m3 roundings are done on the bits (below), not by Triton's casts: the Triton
  3.9 interpreter rounds fp32 → bf16 by truncation and fp32 → e4m3 without carrying a rounded-up
  mantissa into the exponent (124 becomes 64, not 128), so its casts cannot check the kernel
  on a CPU. Written on the bits, the same arithmetic runs in the interpreter (numpy) and
  compiled on a GPU, and the unit test's bit-for-bit epilogue holds on both.
- post/s_act is a correctly rounded division (tl.math.div_rn), as torch's on a tensor divisor;
  Triton's `/` on an NVIDIA GPU is div.full.f32, within 2 ulps (triton-lang/triton#10661).

The kernel: one program per BLOCK_M × BLOCK_N tile of the T×4d output (a 2-D grid, rows of
tiles on the first axis); it loops over d in K-blocks, loading a BLOCK_M × BLOCK_K tile of n₈
and a BLOCK_K × BLOCK_N tile of W₈ᵀ and accumulating their tl.dot in fp32 registers, then runs
the epilogue on the accumulator and stores pre, post, post₈ (as their bits) and one maximum.
Rows and columns past the matrix's edge load valid data again and are not stored; a last
partial K-block is loaded masked, as zeros. Record D's operands (12.6 MB of n₈, 2.4 MB of
c_fc₈ at T = 16,384) fit in an H100's L2, so the order of the tiles is left plain. Both
operands are read fastest with d contiguous (n₈ row-major, c_fc₈ (out, in) row-major: the
layouts `torch._scaled_mm` takes); other strides are read correctly, more slowly.

Triton's interpreter (TRITON_INTERPRET=1) runs tl.dot on the e4m3 tiles as they are (it
upcasts them to fp16, exactly, and multiplies in fp32), so the unit test runs the kernel's own
code, FP8 dot included. The kernel calls no function of triton.language that is itself a
@triton.jit function (tl.zeros, tl.max, tl.cdiv): those are decorated when triton is imported,
and when that was before TRITON_INTERPRET=1 was set (a test process) the interpreter cannot
call them; tl.full and tl.reduce with this module's own combining function stand in.

NaN: an e4m3 NaN operand (0x7F) is read as 480 by the interpreter's upcast, so NaN operands
are not covered on a CPU; a NaN pre (e.g. 0·inf from an infinite scale) goes through the
epilogue as through torch's ops: ReLU and the clamp let it through, post₈ = 0x7F, the tile's
maximum NaN. The NaN-propagating maximum is the compiled kernel's only choice the interpreter
cannot check (numpy's maximum propagates NaN either way).
"""

from __future__ import annotations  # the kernel's tl.constexpr: Triton reads it as text

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.triton_code import TritonCode, available

if TYPE_CHECKING:
    import triton.language as tl  # bound at run time by _CODE.kernel (no Triton on import)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# The kernel's tile on a GPU: 128×128 outputs (a 64 KB fp32 accumulator over 8 warps), the sum
# 128 products a step (record D: d = 768, 6 steps), 3 K-steps' operands in flight (96 KB of
# shared memory)
BLOCKS = (128, 128, 128)
NUM_WARPS, NUM_STAGES = 8, 3
_CODE = TritonCode(globals())  # the kernel and its device functions (model/triton_code.py)
_device = _CODE.device


def fused_up_relu2(
    n8: Tensor,
    w8: Tensor,
    a_scale: Tensor | float,
    s_up: Tensor | float,
    s_act: Tensor | float,
    blocks: tuple[int, int, int] | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The up projection, ReLU² and post's e4m3 quantisation in one kernel (module docstring).

    n8: the quantised input n₈ (T×d, e4m3); w8: c_fc₈ (4d×d, e4m3, (out, in)); any strides
    (a weight stored (in, out) under mlp.fc_in_out: pass its d×4d e4m3 transposed, a view).
    a_scale: a/448 (n₈'s scale), s_up: c_fc₈'s scale, s_act: post₈'s divisor, fp32 scalars
    (0-d tensors on n8's device, no host synchronisation, or Python floats).

    Returns (pre, post, post8, tile_max): pre and post (T×4d, bf16), post₈ (T×4d, e4m3) and
    the maximum of post in each output tile (fp32, ⌈T/block_m⌉ × ⌈4d/block_n⌉; the layer's
    max post is its amax). `blocks`: (block_m, block_n, block_k), powers of two ≥ 16
    (default: BLOCKS, each at most its dimension's next power of two); `num_warps`,
    `num_stages`: the compiled kernel's (the interpreter ignores them)."""
    reason = available(n8.device)
    if reason is not None:
        raise RuntimeError(f"fused_up_relu2: {reason}")
    if n8.dtype != E4M3 or w8.dtype != E4M3 or n8.dim() != 2 or w8.dim() != 2:
        raise ValueError(
            f"n8 (T×d) and w8 (4d×d) must be e4m3 matrices, got {n8.dtype} "
            f"{tuple(n8.shape)} and {w8.dtype} {tuple(w8.shape)}"
        )
    (tokens, inner), width = n8.shape, w8.size(0)
    if w8.size(1) != inner:
        raise ValueError(f"w8 must be 4d×{inner} (out, in), got {tuple(w8.shape)}")
    device = n8.device
    a_scale, s_up, s_act = (
        torch.as_tensor(s, dtype=torch.float32, device=device).reshape(())
        for s in (a_scale, s_up, s_act)
    )
    block_m, block_n, block_k = blocks or tuple(
        min(b, max(16, 1 << max(dim - 1, 1).bit_length()))
        for b, dim in zip(BLOCKS, (tokens, width, inner), strict=True)
    )
    grid = (-(-tokens // block_m), -(-width // block_n))
    pre = torch.empty((tokens, width), dtype=torch.bfloat16, device=device)
    post = torch.empty_like(pre)
    post8 = torch.empty((tokens, width), dtype=E4M3, device=device)
    tile_max = torch.empty(grid, dtype=torch.float32, device=device)
    if tokens and width:
        # The outputs are written as their bits (int16, uint8): the kernel rounds on the bits
        _CODE.kernel("_up_relu2_kernel")[grid](
            n8, w8, pre.view(torch.int16), post.view(torch.int16), post8.view(torch.uint8),
            tile_max, a_scale, s_up, s_act, tokens, width, inner, n8.stride(0), n8.stride(1),
            w8.stride(0), w8.stride(1), width,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=inner % block_k == 0,
            num_warps=num_warps, num_stages=num_stages,
            enable_fp_fusion=False,  # no product meets a sum: explicit, Triton's default changes
        )  # fmt: skip
    return pre, post, post8, tile_max


@_device
def _bf16(x):
    """x (fp32) rounded to the nearest bf16, ties to even, as fp32; ±inf stays. NaN becomes
    the quiet NaN 0x7FC0 (a NaN's low bits alone would round to infinity); torch's CPU cast
    gives 0xFFFF, another NaN: NaN bits are not compared."""
    bits = x.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    rounded = tl.where(x != x, 0x7FC00000, rounded)
    return rounded.to(tl.float32, bitcast=True)


@_device
def _bf16_bits(x):
    """The 16 bits of the bf16 value x (an fp32 that `_bf16` rounded): its upper half."""
    return (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16)


@_device
def _e4m3_byte(x):
    """The e4m3 byte of x (fp32, |x| ≤ 448: the caller clamps), rounded to nearest, ties to
    even, as torch's cast: normal values (from 2⁻⁶) on the bits, subnormal ones (steps of 2⁻⁹)
    by an fp32 addition of 2¹⁴, whose ulp is 2⁻⁹. NaN: 0x7F with its sign, as torch. Past 464
    the mantissa's carry would run into the sign bit: hence the clamp."""
    nan = x != x
    bits = x.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    mag = tl.where(nan, 0, bits & 0x7FFFFFFF)
    normal = (mag - (120 << 23) + 0x7FFFF + ((mag >> 20) & 1)) >> 20  # rebias 127 → 7
    sub = (mag.to(tl.float32, bitcast=True) + 16384.0).to(tl.int32, bitcast=True) - 0x46800000
    byte = tl.where(mag < (121 << 23), sub, normal)
    return (tl.where(nan, 0x7F, byte) | sign).to(tl.uint8)


@_device
def _max_nan(a, b):
    """max(a, b), NaN if either is (torch's amax); the hardware's max would drop a NaN."""
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@_device
def _up_relu2_kernel(
    n_ptr, w_ptr, pre_ptr, post_ptr, post8_ptr, tile_max_ptr, a_scale_ptr, s_up_ptr, s_act_ptr,
    tokens, width, inner: tl.constexpr, n_stride_t, n_stride_k, w_stride_f, w_stride_k, out_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # Rows and columns past the edge read valid ones again (their results are not stored), so
    # the loads need no mask there; int64 offsets: T·d may pass 2³¹ on a long sequence
    a_rows = (rows % tokens).to(tl.int64)
    b_cols = (cols % width).to(tl.int64)
    a_ptrs = n_ptr + a_rows[:, None] * n_stride_t + ks[None, :] * n_stride_k
    b_ptrs = w_ptr + b_cols[None, :] * w_stride_f + ks[:, None] * w_stride_k  # W₈ᵀ's tile
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # tl.zeros: module docstring
    # inner (d) is a constexpr, one per model: Triton 3.6's interpreter under NumPy 2 cannot
    # take a run-time scalar as a loop bound
    for k0 in range(0, inner, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:  # a last partial K-block: zeros add nothing
            a = tl.load(a_ptrs, mask=(k0 + ks)[None, :] < inner, other=0.0)
            b = tl.load(b_ptrs, mask=(k0 + ks)[:, None] < inner, other=0.0)
        # e4m3 × e4m3 on the tensor cores, the partial sums promoted to the fp32 accumulator
        # after each K-block (module docstring)
        acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
        a_ptrs += BLOCK_K * n_stride_k
        b_ptrs += BLOCK_K * w_stride_k
    # The epilogue, in mlp_fp8.py's order (module docstring)
    scale = tl.load(a_scale_ptr) * tl.load(s_up_ptr)  # one fp32 product, as scaled_mm's
    pre = _bf16(acc * scale)
    relu = tl.where(pre < 0.0, 0.0, pre)  # a comparison: NaN goes through, as F.relu
    post = _bf16(relu * relu)  # the square of a bf16 value is exact in fp32: one rounding
    s_act = tl.broadcast_to(tl.load(s_act_ptr), (BLOCK_M, BLOCK_N))  # div_rn: equal shapes
    q = tl.math.div_rn(post, s_act)
    q = tl.where(q > 448.0, 448.0, q)  # min(·, 448), NaN goes through; post ≥ 0
    inside = (rows < tokens)[:, None] & (cols < width)[None, :]
    offsets = rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    tl.store(pre_ptr + offsets, _bf16_bits(pre), mask=inside)
    tl.store(post_ptr + offsets, _bf16_bits(post), mask=inside)
    tl.store(post8_ptr + offsets, _e4m3_byte(q), mask=inside)
    # post ≥ +0, so 0 outside the matrix leaves the tile's maximum alone
    top = tl.reduce(tl.where(inside, post, 0.0), None, _max_nan)
    tl.store(tile_max_ptr + pid_m * tl.num_programs(1) + pid_n, top)
