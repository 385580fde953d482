"""record_2026_07_17's training loss in its own form (model.head.loss=sigmoid_e5m2_grad;
docs/records.md D.2, its FP8 head and loss): the FP8 head, the sigmoid softcap and the (multi-token)
cross-entropy as one autograd function whose backward uses the logit gradient that the loss itself
writes.

With z the head's bf16 logits (FP8 product, model/head.py), A, B, C the cap, shift and divisor
(record: 23, 5, 7.5), w the step's MTP weights (model/mtp.py; [1] without model.head.mtp) and
y_{i+k} the targets shifted along each row (−1: dropped at the row's end):

    σ = bf16(½ + ½·tanh(u/2)),  u = (z + B)/C     fp32 from the bf16 logits, rounded to bf16
    ĉ = A·σ,  lse = logsumexp(ĉ)                    fp32
    loss = Σ_i Σ_k w_k·(lse_i − ĉ_i[y_{i+k}])       the kept terms only, fp32, summed
    G₈ = e5m2_satfinite((A/C)·(1/g_s)·(S_w·p − Σ_k w_k·1[y_{i+k} = j])·σ(1 − σ))

with p = softmax(ĉ) and S_w = Σ_k w_k over all K weights, also at the row's last positions
whose dropped terms are absent from the loss (the record's end-of-sequence quirk: there the
gradient is not the loss's). G₈ is computed in the forward, as the record's fused kernel does,
and the backward hands it straight to the FP8 head's two products (`fp8_grads`) with the
divisor g_s·grad_scale: it is the head's G₈, rounded once.

The incoming gradient's value is ignored, as the record's kernel ignores it; grad_scale =
1/model.micro_steps stands for it. The record multiplies both the gradient and g_s by
grad_scale, so the cast sees the same values whatever the accumulation (here the cast takes
the k = 1 values and the dequantisation g_s/k, as model/head.py does for the FP8 head), and
the gradient reaching the weights is grad_scale·(record's). So this form is only right for a
loss backpropagated as loss / micro_steps, which the trainer does (trainer/forward.py).

The arithmetic is fp32 torch ops, in the order written above: the one-hot sum Σ_k w_k·1[…]
first, subtracted from S_w·p, then times the coefficient (A/C)·(1/g_s) formed from fp32
parameters as fp32(fp32(1/C)·A)·fp32(1/g_s), then ·σ·(1 − σ). The record's CUDA kernel is
compiled with fast math (__expf, __logf, an approximate tanh, possibly fused multiply-adds
and another order of the products), so its σ, p and gradient can differ in the last bits of
fp32, which move a value across a bf16 or e5m2 rounding boundary only rarely. How the
record forms u (here (z + B)/C in fp32) is not known (docs/records.md, where D.1 and D.2
leave a choice).

Rows of `chunk` at a time (model/loss.py's cache-sized chunks on a CPU) keep the fp32
temporaries small; G₈ (one byte a logit) is the only tensor of the logits' size kept. With
model.head.loss_kernel=triton one kernel computes the loss and G₈ of every row instead
(model/triton_loss.py), reading each logit twice and writing its byte once.
"""

import torch
from torch import Tensor, nn

from model.config import HeadConfig
from model.head import FP8Scales, fp8_grads, fp8_product, fp8_scales
from model.loss import default_chunk_rows
from model.mtp import shifted_targets
from model.record_grad import gradient_coefficient

E5M2_MAX = 57344.0  # the largest finite e5m2 value: satfinite clamps to it
# Rows at a time off a CPU: each fp32 temporary of 4,096 × 50,304 logits is 0.8 GB
GPU_CHUNK_ROWS = 4096


def e5m2_satfinite(x: Tensor) -> Tensor:
    """Round to nearest e5m2, out-of-range values to ±57,344 (torch's cast alone gives inf
    from 61,440 on); NaN stays NaN."""
    return x.clamp(-E5M2_MAX, E5M2_MAX).to(torch.float8_e5m2)


def capped_sigmoid(z: Tensor, shift: float, divisor: float) -> Tensor:
    """σ((z + B)/C) in fp32 from the logits, as ½ + ½·tanh(u/2), rounded to bf16."""
    u = (z.float() + shift) / divisor
    return torch.tanh(u * 0.5).mul_(0.5).add_(0.5).to(torch.bfloat16)


def record_loss_rows(
    logits: Tensor, shifted: Tensor, weights: Tensor, cfg: HeadConfig, g_s: float
) -> tuple[Tensor, Tensor]:
    """(the loss summed over these rows (fp32, 0-d), G₈ (rows × V, e5m2)) for bf16 logits
    (rows × V), their shifted targets (rows × K, −1 dropped) and the weights (K,) fp32."""
    cap, shift, divisor = cfg.softcap, cfg.softcap_shift, cfg.softcap_divisor or cfg.softcap / 4
    sig = capped_sigmoid(logits, shift, divisor).float()
    capped = sig * cap
    lse = torch.logsumexp(capped, dim=-1, keepdim=True)
    kept = shifted >= 0
    index = shifted.clamp(min=0)
    picked = capped.gather(1, index)
    w = torch.where(kept, weights, torch.zeros_like(weights))
    loss = ((lse - picked) * w).sum()
    # S_w·p − Σ_k w_k·onehot(y_{i+k}), S_w summing every weight (the quirk)
    onehots = torch.zeros_like(capped).scatter_add_(1, index, w)
    grad = torch.exp(capped - lse).mul_(weights.sum()).sub_(onehots)
    grad.mul_(gradient_coefficient(cap, divisor, g_s, grad.device)).mul_(sig).mul_(1 - sig)
    return loss, e5m2_satfinite(grad)


class RecordHeadLoss(torch.autograd.Function):
    """x (N×d, bf16), W (V×d) → the record's loss, with G₈ from the loss (module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x: Tensor,
        w: Tensor,
        shifted: Tensor,
        weights: Tensor,
        cfg: HeadConfig,
        scales: FP8Scales,
        micro_steps: int,
        chunk: int,
    ) -> Tensor:
        logits, x8, w8 = fp8_product(x, w, scales)
        if cfg.loss_kernel == "triton":  # one kernel over every row, G₈ written in place
            from model.triton_loss import record_loss_rows_triton

            total, g8 = record_loss_rows_triton(logits, shifted, weights, cfg, scales.g)
            ctx.save_for_backward(x8, w8, g8)
            ctx.scales, ctx.micro_steps, ctx.w_dtype = scales, micro_steps, w.dtype
            return total
        n = logits.size(0)
        total = torch.zeros((), dtype=torch.float32, device=logits.device)
        pieces = []
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            loss, g8_rows = record_loss_rows(logits[rows], shifted[rows], weights, cfg, scales.g)
            pieces.append(g8_rows)
            total += loss
        # Concatenated, not written into an empty e5m2 buffer: inductor lowers that write to a
        # select against the buffer's unset value, which it cannot do in FP8 (a type promotion
        # error on a CPU, a NaN e5m2 constant that Triton cannot build on a GPU).
        g8 = torch.cat(pieces)
        ctx.save_for_backward(x8, w8, g8)
        ctx.scales, ctx.micro_steps, ctx.w_dtype = scales, micro_steps, w.dtype
        return total

    @staticmethod
    def backward(ctx, _grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x8, w8, g8 = ctx.saved_tensors
        scales = ctx.scales
        grad_x, grad_w = fp8_grads(g8, x8, w8, scales, scales.g / ctx.micro_steps, ctx.w_dtype)
        return grad_x, grad_w, None, None, None, None, None, None


def record_head_loss(
    head: nn.Linear,
    x: Tensor,
    targets: Tensor,
    weights: Tensor | None,
    cfg: HeadConfig,
    scales: str | FP8Scales,
    micro_steps: int = 1,
    chunk_rows: int | None = None,
) -> Tensor:
    """The training loss of model.head.loss=sigmoid_e5m2_grad for the normed final activations
    x (B, T, d, bf16) and targets (B, T): the FP8 head and the loss in one (module docstring).
    `weights`: the MTP weights (K_max,), None = [1]; `scales`: model.numerics.fp8_scales."""
    flat = x.flatten(0, -2)
    if weights is None:
        weights = torch.ones(1, device=x.device)
    weights = weights.to(device=x.device, dtype=torch.float32)
    shifted = shifted_targets(targets, weights.numel())
    cpu = flat.device.type == "cpu"
    chunk = chunk_rows or (default_chunk_rows(flat.size(0), flat.device) if cpu else GPU_CHUNK_ROWS)
    divisors = fp8_scales(scales, x.size(-1))
    return RecordHeadLoss.apply(
        flat, head.weight, shifted, weights, cfg, divisors, micro_steps, chunk
    )  # fmt: skip
