"""The LM head: an untied linear map to the (padded) vocabulary, optionally in FP8.

FP8 (model.head.fp8, training only): with X the normed final activations (T×d, bf16), W the
head weight (V×d, fp32 or bf16) and three fixed scales written as divisors x_s, w_s, g_s,

    forward:   X₈ = e4m3(X / x_s), W₈ = e4m3(W / w_s);  logits = bf16((X₈·W₈ᵀ)·x_s·w_s)
    backward:  G₈ = e5m2(G / g_s)  for G = ∂L/∂logits (bf16);
               ∂L/∂X = bf16((G₈·W₈)·g_s·w_s),  ∂L/∂W = ((X₈ᵀ·G₈)·x_s·g_s)ᵀ in fp32,
               then cast to W's dtype

each product an FP8 GEMM (`model.fp8.scaled_mm`: the tensor-core kernel on CUDA, with fast
accumulation forward; its exact fp32 emulation on a CPU), reusing X₈ and W₈ from forward. Each
division happens in its operand's dtype (bf16 for X and G) before the cast, as `X.div(x_s)` on
a bf16 tensor does. Casts round to nearest without saturating; the scales keep values in
range. In evaluation the head is the ordinary bf16 matmul.

The scales (model.numerics.fp8_scales, `FP8_SCALES`):
- pow2: x_s = 1/2, w_s = 2⁻⁹, g_s = 2⁻¹⁹ (the 2025-01 record's multipliers 2, 512,
  2¹⁹). All powers of two, so every division and rescale is exact and gives the same bits as
  multiplying by the reciprocals.
- sqrt_d_over_448: x_s = √d/448 (the 2025-11 record's: 0.0618589… at its width d = 768),
  w_s = 2⁻⁹, g_s = 1/448. RMSNorm bounds |X| by √d, so X/x_s ≤ 448 = e4m3's largest value at
  any width.
- fixed_over_448: x_s = 100/448, w_s = 1.6/448, g_s = 0.75/448 (record_2026_07_17, D.1 "Head
  and FP8": the multipliers 4.48, 280 and 597.3), whatever the width.

Under gradient accumulation the loop backpropagates loss / k for each of k micro-steps, so G
arrives k times smaller than a record rank's (8 GPUs, one micro-step each) and e5m2 would
round it at an effective divisor of k·g_s (8·2⁻¹⁹ = 2⁻¹⁶ for 8 micro-steps on one GPU),
flushing more small gradients to zero. `micro_steps` = k casts k·(G/g_s) instead, i.e. G at the
divisor g_s/k, and dequantises with g_s/k, so the cast sees exactly the record's values whatever
the accumulation. G/g_s is taken first and then multiplied by k: with a power-of-two g_s the
division is exact, so this is one rounding of G·k/g_s for every k, the bits of the 2025-01
form; with k = 1 it is the record's G/g_s for any g_s.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor, nn

from model.fp8 import scaled_mm


class FP8Scales(NamedTuple):
    """The FP8 head's three divisors: X₈ = e4m3(X / x), W₈ = e4m3(W / w), G₈ = e5m2(G / g)."""

    x: float
    w: float
    g: float


RECORD_2025_01 = FP8Scales(x=2.0**-1, w=2.0**-9, g=2.0**-19)
# Each named set as a function of the model's width d (only sqrt_d_over_448 depends on it).
FP8_SCALES: dict[str, Callable[[int], FP8Scales]] = {
    "pow2": lambda d: RECORD_2025_01,
    "sqrt_d_over_448": lambda d: FP8Scales(x=math.sqrt(d) / 448, w=2.0**-9, g=1 / 448),
    "fixed_over_448": lambda d: FP8Scales(x=100 / 448, w=1.6 / 448, g=0.75 / 448),
}


def fp8_scales(scales: str | FP8Scales, width: int) -> FP8Scales:
    """`scales` by its model.numerics.fp8_scales name for a model of `width` (d), or as
    given."""
    if isinstance(scales, FP8Scales):
        return scales
    if scales not in FP8_SCALES:
        raise ValueError(
            f"model.numerics.fp8_scales must be one of {' | '.join(FP8_SCALES)}, got {scales!r}"
        )
    return FP8_SCALES[scales](width)


def _scale(value: float, like: Tensor) -> Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


class FP8Matmul(torch.autograd.Function):
    """x (T×d, bf16) · w (V×d, fp32 or bf16)ᵀ in FP8, as in the module docstring; `micro_steps`:
    the accumulation the incoming gradient is divided by; `scales`: the divisors."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        w: Tensor,
        micro_steps: int = 1,
        scales: FP8Scales = RECORD_2025_01,
    ) -> Tensor:
        out, x8, w8 = fp8_product(x, w, scales)
        ctx.save_for_backward(x8, w8)
        ctx.scales, ctx.micro_steps, ctx.w_dtype = scales, micro_steps, w.dtype
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None, None]:  # type: ignore[override]
        x8, w8 = ctx.saved_tensors
        scales, k = ctx.scales, ctx.micro_steps
        scaled = grad.div(scales.g)
        if k != 1:
            scaled = scaled.mul(k)
        g8 = scaled.to(torch.float8_e5m2)
        # g_s / k: the divisor G₈ was taken at, relative to this G
        grad_x, grad_w = fp8_grads(g8, x8, w8, scales, scales.g / k, ctx.w_dtype)
        return grad_x, grad_w, None, None


def fp8_product(x: Tensor, w: Tensor, scales: FP8Scales) -> tuple[Tensor, Tensor, Tensor]:
    """The forward of the module docstring: (logits, X₈, W₈)."""
    x8 = x.div(scales.x).to(torch.float8_e4m3fn)
    w8 = w.div(scales.w).to(torch.float8_e4m3fn)
    out = scaled_mm(
        x8, w8.T, _scale(scales.x, x), _scale(scales.w, x), torch.bfloat16, use_fast_accum=True
    )  # fmt: skip
    return out, x8, w8


def fp8_grads(
    g8: Tensor, x8: Tensor, w8: Tensor, scales: FP8Scales, g_s: float, w_dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """(∂L/∂X, ∂L/∂W) from the e5m2 gradient G₈ taken at the divisor `g_s`, as in the module
    docstring; also the backward of the record's loss form (model/record_loss.py), whose G₈
    comes from the loss itself."""
    grad_x = scaled_mm(g8, w8, _scale(g_s, g8), _scale(scales.w, g8), torch.bfloat16)
    grad_w = scaled_mm(x8.T, g8, _scale(scales.x, g8), _scale(g_s, g8), torch.float32).T
    return grad_x, grad_w.to(w_dtype)


def head_logits(
    head: nn.Linear,
    x: Tensor,
    fp8: bool,
    micro_steps: int = 1,
    scales: str | FP8Scales = "pow2",
) -> Tensor:
    """The head's logits for x (..., d): FP8 when `fp8` and training, else `head(x)`;
    `micro_steps`: the gradient accumulation, `scales`: model.numerics.fp8_scales (module
    docstring)."""
    if fp8 and head.training:
        divisors = fp8_scales(scales, x.size(-1))
        flat = FP8Matmul.apply(x.flatten(0, -2), head.weight, micro_steps, divisors)
        return flat.view(*x.shape[:-1], -1)
    return head(x)
