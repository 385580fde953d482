"""Record D's FP8 up projection and what follows it (model/mlp_fp8.py) as one Triton kernel:
the e4m3 GEMM, its scales, ReLU² and the down projection's e4m3 quantisation of post, in one
launch that writes every result of the tile it computes; and its backward's ∂pre as a second.

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

The backward (`fused_relu2_grad`), with g the gradient of the MLP's output (T×d, bf16) and
c_proj as (4d, d) (bf16):

    acc  = g·c_projᵀ                          exact bf16 products, fp32 sums
    ∂pre = bf16(bf16(2·bf16(acc))·ReLU(pre))  mlp_fp8.py's (g·c_projᵀ)·2·ReLU(pre), its order

where the torch path writes the T×4d product and reads it back with pre: here pre is read into
the tile's epilogue and only ∂pre is written. The ·2 is exact in bf16 but for an overflow to
infinity, which its own rounding keeps. Its sums differ from cuBLAS's or the CPU's in order only
(the bound: tests/unit/test_triton_mlp.py). Under the interpreter the bf16 tiles are made fp32
(exactly) before tl.dot: its dot reads bf16 as the integers of the bits; compiled, tl.dot takes
bf16, the tensor cores' products being exact in fp32 too.

Both kernels are torch ops (`ops`), so torch.compile calls them as they are, one opaque call in
its graph each, and knows their output shapes without running them.

NaN: an e4m3 NaN operand (0x7F) is read as 480 by the interpreter's upcast, so NaN operands
are not covered on a CPU; a NaN pre (e.g. 0·inf from an infinite scale) goes through the
epilogue as through torch's ops: ReLU and the clamp let it through, post₈ = 0x7F, the tile's
maximum NaN. The NaN-propagating maximum is the compiled kernel's only choice the interpreter
cannot check (numpy's maximum propagates NaN either way).
"""

from __future__ import annotations  # the kernel's tl.constexpr: Triton reads it as text

from collections.abc import Callable
from types import SimpleNamespace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from model.triton_code import TritonCode, available, interpreting

if TYPE_CHECKING:
    import triton.language as tl  # bound at run time by _CODE.kernel (no Triton on import)

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# The kernel's tile on a GPU: 128×128 outputs (a 64 KB fp32 accumulator over 8 warps), the sum
# 128 products a step (record D: d = 768, 6 steps), 3 K-steps' operands in flight (96 KB of
# shared memory)
BLOCKS = (128, 128, 128)
# The backward's: bf16 operands, twice the bytes, so half the K-block (the same 96 KB in flight)
GRAD_BLOCKS = (128, 128, 64)
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
    `num_stages`: the compiled kernel's (the interpreter ignores them). A torch op (`ops`):
    torch.compile calls it as it is. RuntimeError where it cannot run (`available`)."""
    if n8.dtype != E4M3 or w8.dtype != E4M3 or n8.dim() != 2 or w8.dim() != 2:
        raise ValueError(
            f"n8 (T×d) and w8 (4d×d) must be e4m3 matrices, got {n8.dtype} "
            f"{tuple(n8.shape)} and {w8.dtype} {tuple(w8.shape)}"
        )
    (tokens, inner), width = n8.shape, w8.size(0)
    if w8.size(1) != inner:
        raise ValueError(f"w8 must be 4d×{inner} (out, in), got {tuple(w8.shape)}")
    a_scale, s_up, s_act = (
        torch.as_tensor(s, dtype=torch.float32, device=n8.device).reshape(())
        for s in (a_scale, s_up, s_act)
    )
    tile = list(blocks or _fitted(BLOCKS, (tokens, width, inner)))
    return ops().up_relu2(n8, w8, a_scale, s_up, s_act, tile, num_warps, num_stages)


def fused_relu2_grad(
    g: Tensor,
    w: Tensor,
    pre: Tensor,
    blocks: tuple[int, int, int] | None = None,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> Tensor:
    """The backward's ∂pre = 2·(g·c_projᵀ)·ReLU(pre) in one kernel (module docstring).

    g: the gradient of the MLP's output (T×d, bf16); w: c_proj as (4d, d), bf16, any strides
    (record D's (out, in) d×4d c_proj: its transposed view); pre: the forward's (T×4d, bf16).
    Returns ∂pre (T×4d, bf16). `blocks`, `num_warps`, `num_stages`: as fused_up_relu2's
    (default: GRAD_BLOCKS). A torch op, as fused_up_relu2."""
    bf16 = torch.bfloat16
    if g.dtype != bf16 or w.dtype != bf16 or pre.dtype != bf16 or g.dim() != 2 or w.dim() != 2:
        raise ValueError(
            f"g (T×d), w (4d×d) and pre (T×4d) must be bf16 matrices, got {g.dtype} "
            f"{tuple(g.shape)}, {w.dtype} {tuple(w.shape)} and {pre.dtype} {tuple(pre.shape)}"
        )
    (tokens, inner), width = g.shape, w.size(0)
    if w.size(1) != inner or pre.shape != (tokens, width):
        raise ValueError(
            f"w must be 4d×{inner} and pre {tokens}×4d, got {tuple(w.shape)} and {tuple(pre.shape)}"
        )
    tile = list(blocks or _fitted(GRAD_BLOCKS, (tokens, width, inner)))
    return ops().relu2_grad(g, w, pre, tile, num_warps, num_stages)


def _fitted(blocks: tuple[int, int, int], dims: tuple[int, int, int]) -> tuple[int, int, int]:
    """Each default block at most its dimension's next power of two (at least 16)."""
    return tuple(  # type: ignore[return-value]
        min(b, max(16, 1 << max(dim - 1, 1).bit_length()))
        for b, dim in zip(blocks, dims, strict=True)
    )


def _grid(tokens: int, width: int, tile: list[int]) -> tuple[int, int]:
    return -(-tokens // tile[0]), -(-width // tile[1])


def _launch_up_relu2(
    n8: Tensor, w8: Tensor, a_scale: Tensor, s_up: Tensor, s_act: Tensor, tile: list[int],
    num_warps: int, num_stages: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    reason = available(n8.device)
    if reason is not None:
        raise RuntimeError(f"fused_up_relu2: {reason}")
    (tokens, inner), width = n8.shape, w8.size(0)
    pre, post, post8, tile_max = _up_relu2_outputs(n8, w8, tile)
    block_m, block_n, block_k = tile
    if tokens and width:
        # The outputs are written as their bits (int16, uint8): the kernel rounds on the bits
        _CODE.kernel("_up_relu2_kernel")[tile_max.shape](
            n8, w8, pre.view(torch.int16), post.view(torch.int16), post8.view(torch.uint8),
            tile_max, a_scale, s_up, s_act, tokens, width, inner, n8.stride(0), n8.stride(1),
            w8.stride(0), w8.stride(1), width,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=inner % block_k == 0,
            num_warps=num_warps, num_stages=num_stages,
            enable_fp_fusion=False,  # no product meets a sum: explicit, Triton's default changes
        )  # fmt: skip
    return pre, post, post8, tile_max


def _up_relu2_outputs(n8: Tensor, w8: Tensor, tile: list[int]) -> tuple[Tensor, ...]:
    """fused_up_relu2's results, empty (also its op's shapes for torch.compile)."""
    tokens, width = n8.size(0), w8.size(0)
    pre = n8.new_empty((tokens, width), dtype=torch.bfloat16)
    post8 = n8.new_empty((tokens, width), dtype=E4M3)
    tile_max = n8.new_empty(_grid(tokens, width, tile), dtype=torch.float32)
    return pre, torch.empty_like(pre), post8, tile_max


def _launch_relu2_grad(
    g: Tensor, w: Tensor, pre: Tensor, tile: list[int], num_warps: int, num_stages: int
) -> Tensor:
    reason = available(g.device)
    if reason is not None:
        raise RuntimeError(f"fused_relu2_grad: {reason}")
    (tokens, inner), width = g.shape, w.size(0)
    pre = pre.contiguous()
    d_pre = _contiguous_like(pre)
    block_m, block_n, block_k = tile
    if tokens and width:
        _CODE.kernel("_relu2_grad_kernel")[_grid(tokens, width, tile)](
            g, w, pre.view(torch.int16), d_pre.view(torch.int16), tokens, width, inner,
            g.stride(0), g.stride(1), w.stride(0), w.stride(1), width,
            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=inner % block_k == 0,
            UPCAST=interpreting(), num_warps=num_warps, num_stages=num_stages,
            enable_fp_fusion=False,
        )  # fmt: skip
    return d_pre


def _contiguous_like(pre: Tensor) -> Tensor:
    return torch.empty_like(pre, memory_format=torch.contiguous_format)


_OPS: SimpleNamespace | None = None


def ops() -> SimpleNamespace:
    """The kernels as torch ops (`up_relu2`, `relu2_grad`), registered at the first call: to
    torch.compile each is one opaque call whose output shapes it knows without running it,
    where a kernel launched from Python would be traced into (Triton's launcher, or its
    interpreter on a CPU) and break the graph. The model registers them when it is built
    (`FP8Mlp`), before anything is compiled."""
    global _OPS
    if _OPS is None:
        up = torch.library.custom_op("gpt_speedrun::mlp_up_relu2", mutates_args=())(
            _launch_up_relu2
        )
        up.register_fake(lambda n8, w8, a, s, s_act, tile, *_: _up_relu2_outputs(n8, w8, tile))
        grad = torch.library.custom_op("gpt_speedrun::mlp_relu2_grad", mutates_args=())(
            _launch_relu2_grad
        )
        grad.register_fake(lambda g, w, pre, *_: _contiguous_like(pre))
        _OPS = SimpleNamespace(
            up_relu2=torch.ops.gpt_speedrun.mlp_up_relu2.default,
            relu2_grad=torch.ops.gpt_speedrun.mlp_relu2_grad.default,
        )
    return _OPS


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


_CODE.costs["_up_relu2_kernel"] = _product_cost("flops8")
_CODE.costs["_relu2_grad_kernel"] = _product_cost("flops16")


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
