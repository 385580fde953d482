"""Model FLOPs utilisation (MFU): the training FLOPs a step needed over what the GPUs could do.

The convention is the one of the PaLM paper's appendix B, which nanoGPT and most speedrun
logs use: a training token costs 6·N FLOPs for the N parameters of its matrix multiplies
(forward 2·N, backward 4·N) plus 12·L·d·T for attention's q·kᵀ and scores·v over a context
of T tokens (L attention layers, model width d). N counts every hidden matrix and the LM head
but not the embedding tables: a lookup multiplies nothing. Recomputation, Newton–Schulz and
masked-out attention positions (causal, sliding windows) are not subtracted or added, so a
windowed or causal model's MFU is the conventional, slightly flattering number.

The peak is the dense bf16 tensor-core rate of the GPU, from its name; an unknown GPU or a
CPU gives no MFU rather than a made-up one.
"""

import torch
from torch import nn

from model.attention import CausalSelfAttention

# Dense (not 2:4 sparse) bf16 peak FLOP/s per GPU, from the vendors' data sheets.
PEAK_BF16 = {
    "H200": 989e12,
    "H100": 989e12,  # SXM; the PCIe card is 756e12 (matched first, below)
    "H100 PCIe": 756e12,
    "GH200": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "RTX 4090": 165e12,
}


def flops_per_token(model: nn.Module, n_embd: int, seq_len: int) -> float:
    """Training FLOPs per token: 6·N + 12·L·d·T (see the module docstring)."""
    tables = {id(p) for m in model.modules() if isinstance(m, nn.Embedding) for p in m.parameters()}
    n = sum(p.numel() for p in model.parameters() if id(p) not in tables and p.ndim >= 2)
    layers = sum(isinstance(m, CausalSelfAttention) for m in model.modules())
    return 6.0 * n + 12.0 * layers * n_embd * seq_len


def peak_flops(device: torch.device) -> float | None:
    """The bf16 peak of the GPU behind `device`, or None (CPU, unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAK_BF16[key]
    return None
