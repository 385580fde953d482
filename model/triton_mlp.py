"""record_2026_07_17's FP8 up projection and what follows it (model/mlp_fp8.py) as one Triton
kernel: the e4m3 GEMM, its scales, ReLU² and the down projection's e4m3 quantisation of post, in one
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
partial K-block is loaded masked, as zeros. record_2026_07_17's operands (12.6 MB of n₈, 2.4 MB of
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

from types import SimpleNamespace

import torch
from torch import Tensor

from model.triton_code import available, interpreting
from model.triton_mlp_kernels import CODE

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# The kernel's tile on a GPU: 128×128 outputs (a 64 KB fp32 accumulator over 8 warps), the sum
# 128 products a step (record_2026_07_17: d = 768, 6 steps), 3 K-steps' operands in flight (96 KB of
# shared memory)
BLOCKS = (128, 128, 128)
# The backward's: bf16 operands, twice the bytes, so half the K-block (the same 96 KB in flight)
GRAD_BLOCKS = (128, 128, 64)
NUM_WARPS, NUM_STAGES = 8, 3
# The kernels and their device functions (model/triton_mlp_kernels.py, model/triton_code.py)
_CODE = CODE


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
    (record_2026_07_17's (out, in) d×4d c_proj: its transposed view); pre: the forward's (T×4d,
    bf16). Returns ∂pre (T×4d, bf16). `blocks`, `num_warps`, `num_stages`: as fused_up_relu2's
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
