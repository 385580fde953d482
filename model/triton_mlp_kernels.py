"""The Triton code of model/triton_mlp.py's two kernels, whose arithmetic its docstring states:
`_up_relu2_kernel` (the e4m3 up projection, its scales, ReLU², post's e4m3 quantisation and
the tile maxima) and `_relu2_grad_kernel` (the backward's ∂pre), their shared tile product
`_tile_dot`, and the roundings done on the bits (`_bf16`, `_e4m3_byte`). Undecorated here,
decorated per Triton mode at the first launch (`CODE`, model/triton_code.py): Triton finds a
kernel's device functions, and `tl`, among this module's globals."""

from __future__ import annotations  # the kernel's tl.constexpr: Triton reads it as text

from collections.abc import Callable
from typing import TYPE_CHECKING

from model.triton_code import TritonCode

if TYPE_CHECKING:
    import triton.language as tl  # bound at run time by CODE.kernel (no Triton on import)

CODE = TritonCode(globals())  # the kernels and their device functions
_device = CODE.device


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
def _tile_dot(
    a_ptr, b_ptr, tokens, width, inner: tl.constexpr, a_stride_t, a_stride_k, b_stride_f,
    b_stride_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, FP8: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """(A[rows]·B[cols]ᵀ in fp32 (BLOCK_M × BLOCK_N), rows, cols) for this program's output
    tile (program ids: its row and column of tiles), A (tokens × inner) and B (width ×
    inner): exact products, summed in K-blocks of BLOCK_K. Rows and columns past the edge read
    valid ones again (the caller does not store their results), so those loads need no mask;
    a last partial K-block is loaded masked, as zeros, which add nothing. FP8: e4m3 operands,
    whose partial sums are promoted to the fp32 accumulator after every K-block (module
    docstring). UPCAST: bf16 operands made fp32 before the dot (exactly), for the interpreter,
    whose dot reads bf16 as the integers of its bits."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # int64 offsets: T·d may pass 2³¹ on a long sequence
    a_rows = (rows % tokens).to(tl.int64)
    b_cols = (cols % width).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * a_stride_t + ks[None, :] * a_stride_k
    b_ptrs = b_ptr + b_cols[None, :] * b_stride_f + ks[:, None] * b_stride_k  # Bᵀ's tile
    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)  # tl.zeros: module docstring
    # inner (d) is a constexpr, one per model: Triton 3.6's interpreter under NumPy 2 cannot
    # take a run-time scalar as a loop bound
    for k0 in range(0, inner, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=(k0 + ks)[None, :] < inner, other=0.0)
            b = tl.load(b_ptrs, mask=(k0 + ks)[:, None] < inner, other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if FP8:  # noqa: SIM108 (a constexpr branch: Triton compiles the one taken)
            acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)  # e4m3 on tensor cores
        else:
            acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * a_stride_k
        b_ptrs += BLOCK_K * b_stride_k
    return acc, rows, cols


@_device
def _up_relu2_kernel(
    n_ptr, w_ptr, pre_ptr, post_ptr, post8_ptr, tile_max_ptr, a_scale_ptr, s_up_ptr, s_act_ptr,
    tokens, width, inner: tl.constexpr, n_stride_t, n_stride_k, w_stride_f, w_stride_k, out_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
):  # fmt: skip
    acc, rows, cols = _tile_dot(
        n_ptr, w_ptr, tokens, width, inner, n_stride_t, n_stride_k, w_stride_f, w_stride_k,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, True, False,
    )  # fmt: skip
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
    tl.store(tile_max_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1), top)


def _product_cost(flops_key: str) -> Callable:
    """A tile-product kernel's declared cost: 2·tokens·width·inner FLOPs of its operands'
    kind (e4m3: "flops8", bf16: "flops16"); its bytes are its tensors' (the ledger's count)."""

    def cost(grid: object, metadata: object, args: dict) -> dict:
        return {flops_key: 2.0 * args["tokens"] * args["width"] * args["inner"]}

    return cost


CODE.costs["_up_relu2_kernel"] = _product_cost("flops8")
CODE.costs["_relu2_grad_kernel"] = _product_cost("flops16")


@_device
def _relu2_grad_kernel(
    g_ptr, w_ptr, pre_ptr, d_pre_ptr, tokens, width, inner: tl.constexpr, g_stride_t,
    g_stride_k, w_stride_f, w_stride_k, out_stride, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    acc, rows, cols = _tile_dot(
        g_ptr, w_ptr, tokens, width, inner, g_stride_t, g_stride_k, w_stride_f, w_stride_k,
        BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, False, UPCAST,
    )  # fmt: skip
    inside = (rows < tokens)[:, None] & (cols < width)[None, :]
    offsets = rows.to(tl.int64)[:, None] * out_stride + cols[None, :]
    # pre read as its bits (the interpreter's bf16 casts: module docstring); exact in fp32
    pre = (tl.load(pre_ptr + offsets, mask=inside, other=0).to(tl.int32) << 16).to(
        tl.float32, bitcast=True
    )
    # The backward's ops, in mlp_fp8.py's order: the bf16 product, ·2 (exact, but for an
    # overflow to inf, which the rounding keeps), ·ReLU(pre) rounded once
    doubled = _bf16(_bf16(acc) * 2.0)
    relu = tl.where(pre < 0.0, 0.0, pre)  # NaN goes through, as F.relu
    tl.store(d_pre_ptr + offsets, _bf16_bits(_bf16(doubled * relu)), mask=inside)
