"""YaRN (Peng et al. 2023) as the 2025-11 record applies it (RECORD_C.md C.4): whenever the
long window grows from W₀ to W₁ tokens, every rotary frequency is rescaled and the attention
scale raised, cumulatively, from stage to stage:

    ρ_j = W₀·ω_j / (2π)                      turns of frequency j over the old long window
    γ_j = clamp((ρ_j − 1) / 31, 0, 1)         1: fast enough to keep, 0: interpolate fully
    ω_j <- ω_j · (W₀/W₁ + γ_j·(1 − W₀/W₁))
    s   <- s · (1 + 0.2·ln(W₁/W₀))

Zero frequencies stay zero. The frequencies are computed in fp32, as the record's tables.
"""

import itertools
import math

import torch
from torch import Tensor


def yarn_table(
    base_inv_freq: Tensor, long_windows: list[int], base_scale: float
) -> tuple[Tensor, list[float]]:
    """The frequencies (stages, len(base_inv_freq)) fp32 and attention scales of each stage:
    stage 0 is the base, stage k the result of the steps long_windows[0] → … → [k]."""
    omega = base_inv_freq.float().clone()
    rows, scales = [omega], [base_scale]
    for w0, w1 in itertools.pairwise(long_windows):
        ratio = w0 / w1
        turns = w0 * omega / (2 * math.pi)
        gamma = ((turns - 1) / 31).clamp(0, 1)
        omega = omega * (ratio + gamma * (1 - ratio))
        rows.append(omega)
        scales.append(scales[-1] * (1 + 0.2 * math.log(w1 / w0)))
    return torch.stack(rows), scales
