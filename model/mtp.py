"""Multi-token prediction (record_2026_07_17, #53): one head scored against the next K tokens.

For position i of a row (one rank's packed sequence) with logits z_i and capped logits ĉ_i,

    ℓ_i = Σ_k w_k·(lse_i − ĉ_i[y_{i+k}]),   k = 0 … K−1,   lse_i = logsumexp(ĉ_i)

with y_i the target of position i (the token after it), so term k scores the token k + 1
ahead. The targets are taken along the packed row without document masking, and terms with
i + k ≥ T fall away at the row's end. The training loss is Σ_i ℓ_i over every row (or its
mean over positions); evaluation stays next-token cross-entropy (model/loss.py).

The weights are a step value, a column of the stage table (train.stages.rows.N.mtp_weights,
model/mtp_schedule.py): the schedule hands them to the forward as a 1-D tensor, as it hands over
the windows, so a compiled model does not recompile as they change. Its length is fixed at
K_max, the longest row's, and the weights a stage drops are zeros. A zero weight adds nothing
to the loss, the gradient or the record form's S_w = Σ_k w_k, so the padded tensor computes
what the record's K(s)-long one does.

Here: the targets shifted along each row, and the loss in its autograd form
(head.loss=plain or auto). The record's own form, with its e5m2 logit gradient, is
model/record_loss.py.
"""

import torch
from torch import Tensor


def shifted_targets(targets: Tensor, k_max: int) -> Tensor:
    """(B·T, k_max) int64: column k holds y_{i+k} of each row, −1 where i + k ≥ T (dropped)."""
    rows, t = targets.shape
    out = torch.full((rows, t, k_max), -1, dtype=torch.int64, device=targets.device)
    for k in range(min(k_max, t)):
        out[:, : t - k, k] = targets[:, k:]
    return out.flatten(0, 1)


def mtp_cross_entropy(capped: Tensor, targets: Tensor, weights: Tensor, mean: bool) -> Tensor:
    """Σ_i Σ_k w_k·(lse_i − ĉ_i[y_{i+k}]) over the kept terms (or its mean over positions),
    by autograd: its gradient is the true one, S_w counting only each position's kept terms.
    capped: (B, T, V) capped logits (fp32 at least); targets: (B, T); weights: (K_max,)."""
    shifted = shifted_targets(targets, weights.numel())
    logp = torch.log_softmax(capped.flatten(0, 1), dim=-1)
    picked = logp.gather(1, shifted.clamp(min=0))
    kept = (shifted >= 0).to(logp.dtype) * weights.to(logp.dtype)
    total = -(picked * kept).sum()
    return total / shifted.size(0) if mean else total
