"""An fp32 master for a bf16 matrix, kept as the record keeps it (optim.muon.master_weights).

The 2026-07 record (#57) stores each Muon matrix as its bf16 weight plus a 16-bit buffer of
the low mantissa bits: together they are the 32 bits of an fp32 master, W = bits(bf16) ‖
bits(low). Each step reconstructs the master, updates it in fp32, and splits it again: the
upper half is the master truncated toward zero to bf16 (what the forward sees), the lower
half the new buffer. So the master costs 2 bytes per parameter on top of the bf16 weight (4 in
all, where a separate fp32 copy would make it 6), and is exact: no rounding anywhere.
"""

import torch
from torch import Tensor


def new_mantissa(p: Tensor) -> Tensor:
    """The low half of a master equal to the bf16 weight `p`: zeros (int16, which the
    optimizer's state_dict never casts to the parameter's dtype)."""
    if p.dtype != torch.bfloat16:
        raise ValueError(
            "optim.muon.master_weights=fp32_truncated needs bf16 matrices "
            f"(model.numerics.bf16_matrices=true); got a {p.dtype} parameter of shape "
            f"{tuple(p.shape)}"
        )
    return torch.zeros(p.shape, dtype=torch.int16, device=p.device)


def master_of(p: Tensor, mantissa: Tensor) -> Tensor:
    """The fp32 master of bf16 weight `p` and its low half `mantissa`."""
    high = p.view(torch.int16).to(torch.int32) << 16
    low = mantissa.to(torch.int32) & 0xFFFF
    return (high | low).view(torch.float32)


def truncate(master: Tensor) -> Tensor:
    """`master` truncated toward zero to bf16: its upper 16 bits."""
    return (master.view(torch.int32) >> 16).to(torch.int16).view(torch.bfloat16)
