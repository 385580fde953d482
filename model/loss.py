"""Cross-entropy of tanh-softcapped logits, fused and computed in row chunks.

The plain form, `cross_entropy(cap * tanh(logits / cap), y)`, makes about six full passes over
the (tokens × 50304) logits in each direction and keeps three copies of them for backward. On
a CPU that memory traffic costs more than the LM-head matmul itself. Here each chunk of rows
is small enough to stay in cache while all its passes run, only the raw logits and one
log-sum-exp per row are kept, and backward recomputes the tanh:

    z = cap · tanh(l / cap)          loss = mean(logsumexp(z) - z[y])
    dl = (softmax(z) - onehot(y)) · (1 - tanh²(l / cap)) / N

(or the sum, without the / N). `model_loss` picks this path or the plain formula for the model.
"""

import torch
import torch.nn.functional as F
from torch import Tensor

from model.config import HeadConfig
from model.mtp import mtp_cross_entropy

# Rows per chunk on CPU: 128 × 50304 fp32 logits are 26 MB, which mostly stays in cache across
# the passes below (measured fastest of 4..2048 rows: 0.9 s vs 2.5 s for 2048 × 50304 logits,
# forward + backward, on 2 cores). GPUs are not cache-bound here and take the whole tensor.
CPU_CHUNK_ROWS = 128


def default_chunk_rows(n: int, device: torch.device) -> int:
    """Rows per chunk: cache-sized on a CPU, all of them at once elsewhere."""
    return CPU_CHUNK_ROWS if device.type == "cpu" else max(n, 1)


class _SoftcapCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, cap: float, chunk: int, mean: bool) -> Tensor:
        n = logits.size(0)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for i in range(0, n, chunk):
            rows = slice(i, i + chunk)
            z = torch.tanh(logits[rows].float() / cap).mul_(cap)
            lse[rows] = torch.logsumexp(z, dim=-1)
            picked = z.gather(1, targets[rows, None]).squeeze(1)
            total += (lse[rows] - picked).sum(dtype=torch.float64)
        ctx.save_for_backward(logits, targets, lse)
        ctx.cap, ctx.chunk, ctx.mean = cap, chunk, mean
        return (total / n if mean else total).float()

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        cap, n = ctx.cap, logits.size(0) if ctx.mean else 1
        grad = torch.empty_like(logits)
        scale = grad_out.float() / n
        for i in range(0, n, ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            t = torch.tanh(logits[rows].float() / cap)
            p = torch.exp(t * cap - lse[rows, None])  # softmax(z)
            p.scatter_add_(1, targets[rows, None], torch.full_like(p[:, :1], -1.0))
            # dz/dl = 1 - tanh²(l / cap), so dl = (p - onehot) · (1 - t²)
            p.addcmul_(p, t.square_(), value=-1.0).mul_(scale)
            grad[rows] = p
        return grad, None, None, None, None


def softcap(
    logits: Tensor, cap: float, form: str = "tanh", shift: float = 0.0, divisor: float = 0.0
) -> Tensor:
    """tanh: cap·tanh(z/cap), in (−cap, cap) | sigmoid: cap·σ((z + shift)/τ), in (0, cap), with
    τ = divisor or cap/4 (with shift 0 and τ = cap/4 the tanh curve shifted up by cap/2 with
    half the cap: 30·σ(z/7.5) = 15·tanh(z/15) + 15; record_2026_07_17: 23·σ((z + 5)/7.5)).

    The sigmoid form divides by τ, as the records divide by 7.5, rather than multiplying by
    1/τ: 4/30 is not exact in binary, so the product would round differently from the record's
    quotient on some logits. The shift is added first, in the logits' dtype, as the record's
    (z + 5) is."""
    if form == "sigmoid":
        z = logits + shift if shift else logits
        return cap * torch.sigmoid(z / (divisor or cap / 4))
    return cap * torch.tanh(logits / cap)


def softcap_cross_entropy(
    logits: Tensor,
    targets: Tensor,
    cap: float,
    chunk_rows: int | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Cross-entropy of `cap · tanh(logits / cap)` against `targets`, the mean or the sum.

    logits: (N, V); targets: (N,) int64. `cap` must be > 0. `chunk_rows`: rows computed at a
    time (default: `default_chunk_rows` for the logits' device).
    """
    chunk = chunk_rows or default_chunk_rows(logits.size(0), logits.device)
    return _SoftcapCrossEntropy.apply(logits, targets, cap, chunk, reduction == "mean")


def model_loss(
    logits: Tensor,
    targets: Tensor | None,
    cfg: HeadConfig,
    training: bool,
    mtp_weights: Tensor | None = None,
) -> Tensor:
    """The model's output from its head's logits (B, T, V): the softcapped logits (at least
    fp32) when `targets` is None, else the loss as `cfg` (model.head) asks.

    model.head.mtp: in training the multi-token loss with the step's `mtp_weights` (K_max,),
    by autograd in fp32 at least (model/mtp.py); evaluation is next-token as without it.

    model.head.reduction=sum sums over tokens in training only; evaluation is always the mean.
    model.head.loss_dtype=bf16 caps in the logits' own dtype and, in training, takes the
    cross-entropy in it too (evaluation: in fp32 at least); bf16_train caps in the logits'
    dtype in training only and takes the cross-entropy (or the MTP loss) of those capped values
    in fp32 (evaluation: the cap in fp32). Neither is the fused path, which computes in fp32
    (model.head.loss=fused is refused with them, auto takes the plain formula).
    """
    cap = cfg.softcap
    reduction = "sum" if training and cfg.reduction == "sum" else "mean"
    # The cap in the logits' own dtype: always with bf16, in training with bf16_train
    low = cfg.loss_dtype == "bf16" or (
        cfg.loss_dtype == "bf16_train" and training and targets is not None
    )
    cpu = logits.device.type == "cpu"
    at_least_fp32 = torch.promote_types(logits.dtype, torch.float32)
    if training and targets is not None and cfg.mtp:
        if mtp_weights is None:
            raise ValueError("model.head.mtp: the training forward needs the step's mtp_weights")
        z = logits if low else logits.to(at_least_fp32)
        if cap > 0:
            z = softcap(z, cap, cfg.softcap_form, cfg.softcap_shift, cfg.softcap_divisor)
        return mtp_cross_entropy(z.to(at_least_fp32), targets, mtp_weights, reduction == "mean")
    fused = cfg.loss == "fused" or (cfg.loss == "auto" and cpu and cfg.tanh_expressible)
    if targets is not None and cap > 0 and fused and cfg.loss_dtype == "fp32":
        # 30·σ(z/7.5) = 15·tanh(z/15) + 15, and a constant shift leaves the loss as it is.
        tanh_cap = cap if cfg.softcap_form == "tanh" else cap / 2
        return softcap_cross_entropy(
            logits.flatten(0, 1), targets.flatten(), tanh_cap, reduction=reduction
        )
    if not low:
        logits = logits.to(at_least_fp32)
    if cap > 0:
        logits = softcap(logits, cap, cfg.softcap_form, cfg.softcap_shift, cfg.softcap_divisor)
    if targets is None or not training or cfg.loss_dtype == "bf16_train":
        logits = logits.to(at_least_fp32)
    if targets is None:
        return logits
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction=reduction)
