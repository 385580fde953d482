"""YaRN for a growing attention window (the 2025-11 record): the rotary frequencies and the
attention scale after each change of the long window.

Rotary frequency ω_j turns ρ_j = W₀·ω_j/(2π) times over the old long window of W₀ tokens.
When the window grows from N₀ to N₁ blocks, a frequency that turns many times over the old
window already tells positions apart within it and is kept; one that turns less than once
would see angles it never trained on, so it is slowed by N₀/N₁ (the new window then spans the
angles the old one did); in between it is blended (Peng et al. 2023, "YaRN", by parts):

    γ_j = clamp((ρ_j − 1) / 31, 0, 1),   ω_j ← ω_j · (N₀/N₁ + γ_j · (1 − N₀/N₁)).

Each change starts from the frequencies of the one before (cumulative), in fp32 tensors as the
rotary tables are. The attention scale rises with the log of the growth, from the model's
base scale: s ← s · (1 + 0.2 · ln(N₁/N₀)), in Python floats (float64). Zero frequencies (the
unrotated half of a half-truncated rotary) stay zero.

`yarn_table` is pure: the model builds it once from its base frequencies
(`Rotary.inv_freq`) and the stage table's long windows (model/forward_schedule.py
`yarn_windows`), and the step's "yarn_stage" forward argument (`forward_args`) picks the row.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

# A frequency turning more than this many times (+1) over the old window is kept as is.
FULL_TURNS = 31.0
# The attention scale's growth per unit of ln(N₁/N₀).
SCALE_SLOPE = 0.2


@dataclass(frozen=True)
class YarnTable:
    """Row k: the values after the k-th window change (row 0 = the base)."""

    freqs: Tensor  # (stages, n) fp32: the rotary frequencies ω_j
    attn_scales: list[float]  # the attention scale of each stage


def yarn_table(
    base_freqs: Tensor,
    windows: Sequence[int],
    window_block: int,
    attn_scale: float,
    max_window: int = 0,
) -> YarnTable:
    """The frequencies and attention scales for the long windows `windows` (in blocks of
    `window_block` tokens, in the order the run uses them: stage k runs with windows[k]),
    from `base_freqs` (1-d, converted to fp32) and the base `attn_scale`.

    The 2025-11 record: windows [3, 7, 11, 13], blocks of 128, base scale 0.1, ω the
    half-truncated rotary's 64 (1024^(−j/31) for j < 32, then 0): scales 0.1, 0.116946,
    0.127518, 0.131778.

    With `max_window` (model.attention.yarn_max_window), a change to a window of more blocks keeps
    the frequencies and the scale (its row repeats the one before), and the next change that
    rescales starts from the window they were last made for. record_medium_2025_12_31: [3, 7, 11,
    13, 15, …, 23] with 13: the scales above, then 0.131778 from window 13 on.
    """
    if base_freqs.dim() != 1:
        raise ValueError(f"base_freqs must be 1-d, got shape {tuple(base_freqs.shape)}")
    if not windows:
        raise ValueError("windows must name at least one long window")
    if not all(n >= 1 for n in windows) or window_block < 1:
        raise ValueError(
            f"windows ({list(windows)}) and window_block ({window_block}) must be >= 1"
        )
    omega = base_freqs.detach().to(dtype=torch.float32).clone()
    rows, scales, scale = [omega], [float(attn_scale)], float(attn_scale)
    fitted = windows[0]  # the window the current frequencies were made for
    for n1 in windows[1:]:
        if max_window and n1 > max_window:
            rows.append(omega)
            scales.append(scale)
            continue
        n0, fitted = fitted, n1
        turns = window_block * n0 * omega / (2 * math.pi)
        gamma = ((turns - 1) / FULL_TURNS).clamp(0, 1)
        ratio = n0 / n1
        omega = omega * (ratio + gamma * (1 - ratio))
        scale = scale * (1 + SCALE_SLOPE * math.log(n1 / n0))
        rows.append(omega)
        scales.append(scale)
    return YarnTable(torch.stack(rows), scales)
