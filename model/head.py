"""The LM head: an untied linear map to the (padded) vocabulary, optionally in FP8.

FP8 (model.fp8_head, training only, the 2025-01 record's scales): with X the normed final
activations (T×d, bf16) and W the fp32 head weight (V×d),

    forward:   X₈ = e4m3(2·X), W₈ = e4m3(512·W);  logits = bf16((X₈·W₈ᵀ) / (2·512))
    backward:  G₈ = e5m2(2¹⁹·G)  for G = ∂L/∂logits (bf16);
               ∂L/∂X = bf16((G₈·W₈) / (2¹⁹·512)),  ∂L/∂W = fp32((G₈ᵀ·X₈) / (2¹⁹·2))

each product an FP8 tensor-core GEMM (`torch._scaled_mm`; fast accumulation forward), reusing
X₈ and W₈ from forward. Casts round to nearest without saturating; the scales keep values in
range. In evaluation the head is the ordinary bf16 matmul.

Under gradient accumulation the loop backpropagates loss / k for each of k micro-steps, so G
arrives k times smaller than a record rank's (8 GPUs, one micro-step each) and e5m2 would
round it at an effective scale of 2¹⁹/k (2¹⁶ for 8 micro-steps on one GPU), flushing more
small gradients to zero. `micro_steps` = k multiplies the cast's scale by k and divides the
result by it again, so the cast sees exactly the record's values whatever the accumulation.
"""

import torch
from torch import Tensor, nn

X_SCALE, W_SCALE, GRAD_SCALE = 2.0, 512.0, 2.0**19


def _scale(value: float, like: Tensor) -> Tensor:
    return torch.tensor(value, dtype=torch.float32, device=like.device)


class FP8Matmul(torch.autograd.Function):
    """x (T×d, bf16) · w (V×d, fp32)ᵀ in FP8, as in the module docstring; `micro_steps`: the
    accumulation the incoming gradient is divided by."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, micro_steps: int = 1) -> Tensor:  # type: ignore[override]
        x8 = (x * X_SCALE).to(torch.float8_e4m3fn)
        w8 = (w * W_SCALE).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            x8, w8.T,  # row-major × column-major, as the FP8 GEMM wants
            scale_a=_scale(1 / X_SCALE, x), scale_b=_scale(1 / W_SCALE, x),
            out_dtype=torch.bfloat16, use_fast_accum=True,
        )  # fmt: skip
        ctx.save_for_backward(x8, w8)
        ctx.grad_scale = GRAD_SCALE * micro_steps
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:  # type: ignore[override]
        x8, w8 = ctx.saved_tensors
        g_scale = ctx.grad_scale
        g8 = (grad * g_scale).to(torch.float8_e5m2)
        grad_x = torch._scaled_mm(
            g8, w8.T.contiguous().T,
            scale_a=_scale(1 / g_scale, grad), scale_b=_scale(1 / W_SCALE, grad),
            out_dtype=torch.bfloat16,
        )  # fmt: skip
        grad_w = torch._scaled_mm(
            x8.T.contiguous(), g8.T.contiguous().T,
            scale_a=_scale(1 / X_SCALE, grad), scale_b=_scale(1 / g_scale, grad),
            out_dtype=torch.float32,
        ).T  # fmt: skip
        return grad_x, grad_w, None


def head_logits(head: nn.Linear, x: Tensor, fp8: bool, micro_steps: int = 1) -> Tensor:
    """The head's logits for x (..., d): FP8 when `fp8` and training, else `head(x)`;
    `micro_steps`: the gradient accumulation (see the module docstring)."""
    if fp8 and head.training:
        flat = FP8Matmul.apply(x.flatten(0, -2), head.weight, micro_steps)
        return flat.view(*x.shape[:-1], -1)
    return head(x)
