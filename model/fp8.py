"""The FP8 product: a scaled FP8 GEMM on CUDA, the same arithmetic in fp32 on a CPU.

Every FP8 matmul of the model (the LM head today, the MLP projections of later records) goes
through `scaled_mm(a8, b8, scale_a, scale_b, out_dtype)`, which computes

    out = out_dtype((a8 · b8) · (scale_a · scale_b))

with a8, b8 FP8 tensors (e4m3 or e5m2), the products accumulated in fp32, and the scales
applied once to the accumulated sum, as the FP8 tensor-core GEMM (`torch._scaled_mm` on CUDA)
applies them.

On a CPU the product is emulated: the FP8 operands upcast to fp32 (every e4m3 and e5m2 value
is exact there, and so is the product of two of them, at most 8 significant bits), an fp32
matmul, then the scales. torch's own CPU kernel for `_scaled_mm` costs 650–3,500× a bf16
matmul on Intel CPUs with AMX (2-core Xeon, torch 2.13), which made an FP8 step take minutes
there; an fp32 matmul runs at the same order of speed on every CPU kind, gives the same bits
whatever the thread count, and does not depend on the CPU's bf16 support. The larger operand
(a head's tokens × 50,304 gradient) is upcast a slice at a time, `CHUNK_ELEMENTS` values, so
that its fp32 copy stays in cache instead of costing a fresh buffer of 4 bytes a value
(scripts/bench/fp8.py): slices of the output's rows or columns where one of those is the
longest side, else of the summed dimension (the head's ∂X sums over the vocabulary), whose
fp32 partial sums then add up in another order than one matmul's, as two GEMM kernels' do.

The results equal `_scaled_mm`'s wherever the fp32 sums are exact, and otherwise differ by the
accumulation order only (tests/unit/test_fp8.py). The CPU kernel also multiplies each operand
by its scale before the product, where the CUDA kernel (and this emulation) scales the sum, so
with scales that are not powers of two the two differ in the last bits of fp32.
"""

import torch
from torch import Tensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
# Values of the larger operand upcast at a time on a CPU: 4 MB of fp32, measured fastest of
# 2^16..2^22 for the head's three products (512 tokens × 64 → 50,304)
CHUNK_ELEMENTS = 2**20


def scaled_mm(
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    out_dtype: torch.dtype,
    use_fast_accum: bool = False,
) -> Tensor:
    """(a · b) · scale_a · scale_b in `out_dtype`, for FP8 a (m×k) and b (k×n) in any layout
    and fp32 scalar scales: `torch._scaled_mm` on CUDA (a copied row-major and b column-major
    where they are not, the layouts the kernel takes), `emulated_scaled_mm` elsewhere.
    `use_fast_accum` is the CUDA kernel's (Hopper's faster, less exact accumulation in the
    forward); the emulation always accumulates in full fp32."""
    if a.device.type == "cuda":
        b = b if b.T.is_contiguous() else b.T.contiguous().T
        return torch._scaled_mm(
            a.contiguous(), b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )  # fmt: skip
    return emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)


def emulated_scaled_mm(
    a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: torch.dtype
) -> Tensor:
    """The FP8 GEMM's arithmetic with ordinary kernels: exact fp32 products of the FP8 values,
    fp32 sums, the two scales' product applied to them, one rounding to `out_dtype`; the
    longest side (m, n or the summed k) a slice at a time (module docstring)."""
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES:
        raise TypeError(f"scaled_mm takes FP8 operands, got {a.dtype} and {b.dtype}")
    (m, k), n = a.shape, b.size(1)
    scale = scale_a.float() * scale_b.float()
    if k > max(m, n):  # the sum in slices: both operands' slices upcast, partial sums added
        step = max(1, CHUNK_ELEMENTS // max(m, n))
        acc = torch.zeros(m, n, dtype=torch.float32, device=a.device)
        for i in range(0, k, step):
            acc.addmm_(a[:, i : i + step].float(), b[i : i + step].float())
        return acc.mul_(scale).to(out_dtype)
    out = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m >= n:  # the rows of a in slices, b upcast once
        whole, step = b.float(), max(1, CHUNK_ELEMENTS // k)
        for i in range(0, m, step):
            out[i : i + step] = torch.mm(a[i : i + step].float(), whole).mul_(scale)
    else:  # the columns of b in slices, a upcast once
        whole, step = a.float(), max(1, CHUNK_ELEMENTS // k)
        for j in range(0, n, step):
            out[:, j : j + step] = torch.mm(whole, b[:, j : j + step].float()).mul_(scale)
    return out
