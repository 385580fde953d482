"""The FP8 product: a scaled FP8 GEMM on CUDA, the same arithmetic in fp32 on a CPU.

Every FP8 matmul of the model (the LM head today, the MLP projections of later records) goes
through `scaled_mm(a8, b8, scale_a, scale_b, out_dtype)`, which computes

    out = out_dtype((a8 · b8) · (scale_a · scale_b))

with a8, b8 FP8 tensors (e4m3 or e5m2), the products accumulated in fp32, and the scales
applied once to the accumulated sum, as the FP8 tensor-core GEMM (`torch._scaled_mm` on CUDA)
applies them.

On a CPU the product is emulated: the FP8 operands upcast to fp32 (every e4m3 and e5m2 value
is exact there, and so is the product of two of them, at most 8 significant bits), one fp32
matmul, then the scales. torch's own CPU kernel for `_scaled_mm` costs 650–3,500× a bf16
matmul on Intel CPUs with AMX (2-core Xeon, torch 2.13), which made an FP8 step take minutes
there; an fp32 matmul runs at the same order of speed on every CPU kind, is bitwise the same
whatever the thread count, and does not depend on the CPU's bf16 support. The results equal
`_scaled_mm`'s wherever the fp32 sums are exact, and otherwise differ by the accumulation order
only (tests/unit/test_fp8.py); the CPU kernel also multiplies each operand by its scale before
the product, where the CUDA kernel (and this emulation) scales the sum, so with scales that are
not powers of two the two differ in the last bits of fp32.
"""

import torch
from torch import Tensor

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def scaled_mm(
    a: Tensor,
    b: Tensor,
    scale_a: Tensor,
    scale_b: Tensor,
    out_dtype: torch.dtype,
    use_fast_accum: bool = False,
) -> Tensor:
    """(a · b) · scale_a · scale_b in `out_dtype`, for FP8 a (m×k, row-major) and b (k×n,
    column-major) and fp32 scalar scales: `torch._scaled_mm` on CUDA, `emulated_scaled_mm`
    elsewhere. `use_fast_accum` is the CUDA kernel's (Hopper's faster, less exact accumulation
    in the forward); the emulation always accumulates in full fp32."""
    if a.device.type == "cuda":
        return torch._scaled_mm(
            a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype,
            use_fast_accum=use_fast_accum,
        )  # fmt: skip
    return emulated_scaled_mm(a, b, scale_a, scale_b, out_dtype)


def emulated_scaled_mm(
    a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor, out_dtype: torch.dtype
) -> Tensor:
    """The FP8 GEMM's arithmetic with ordinary kernels: exact fp32 products of the FP8 values,
    an fp32 sum, the two scales' product applied to it, one rounding to `out_dtype`."""
    if a.dtype not in FP8_DTYPES or b.dtype not in FP8_DTYPES:
        raise TypeError(f"scaled_mm takes FP8 operands, got {a.dtype} and {b.dtype}")
    acc = torch.mm(a.float(), b.float())
    return acc.mul_(scale_a.float() * scale_b.float()).to(out_dtype)
