"""The coefficient of record_2026_07_17's logit gradient (model.head.loss=sigmoid_e5m2_grad), shared
by its torch form (model/record_loss.py) and its Triton kernel (model/triton_loss.py), so that both
scale the gradient by the same fp32 number."""

import torch
from torch import Tensor


def gradient_coefficient(cap: float, divisor: float, g_s: float, device: torch.device) -> Tensor:
    """(A/C)·(1/g_s) in fp32 as the record's kernel forms it from fp32 parameters:
    fp32(fp32(1/C)·A)·fp32(1/g_s)."""
    one = torch.ones((), dtype=torch.float32, device=device)
    c, a, g = (torch.tensor(v, dtype=torch.float32, device=device) for v in (divisor, cap, g_s))
    return (one / c * a) * (one / g)
