"""Model FLOPs utilisation (MFU): the training FLOPs a step needed over what the GPUs could do.

The FLOPs of a batch are counted by `model/flops.py` (PaLM's convention, attention over the
context each layer's mask lets through); this module holds what turns them into MFU: the
GPU's peak and the division. The training loop and `scripts/bench/gpu.py` both use the two,
so the step line and the benchmark print the same number for the same step.

The peak is the dense bf16 tensor-core rate of the GPU, from its name; an unknown GPU or a
CPU gives no MFU rather than a made-up one.
"""

import torch

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


def mfu(flops: float, seconds: float, peak: float, world_size: int = 1) -> float:
    """The share of `world_size` GPUs' peak (`peak` FLOP/s each) that `flops` done by all of
    them in `seconds` is."""
    return flops / seconds / (peak * world_size)


def peak_flops(device: torch.device) -> float | None:
    """The bf16 peak of the GPU behind `device`, or None (CPU, unknown GPU)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key in sorted(PEAK_BF16, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in name:
            return PEAK_BF16[key]
    return None
