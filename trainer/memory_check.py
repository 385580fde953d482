"""Whether a run fits its device's memory, checked before its first step.

A record preset at full size on a CPU (`data=sample` makes it start without a GPU) asks for
tens of GiB in its first step, and the kernel's OOM killer ends it with no word from the run.
So a CPU run estimates what its steps add to the parameters already built, and refuses when
that exceeds the memory the machine has available, with the numbers and the way to a toy.

The estimate, per rank (`estimate`):
- gradients, one per parameter in its dtype, and optimizer state at most two fp32 values per
  parameter (Adam's moments; Muon keeps one);
- activations kept for backward, LINEAR_BYTES per layer, token and channel of a micro-batch;
- where attention runs with a mask (documents or windows, the record presets): eager, the
  scores the CPU kernel materialises, SCORE_BYTES per head and (query, key) pair; compiled,
  the dense boolean mask it still reads; one layer at a time, for the longer of a training
  micro-batch and an evaluation batch. Plain causal attention runs a flash kernel: nothing.
Both constants were fitted on record #21's model at 2,048, 4,096 and 8,192 tokens per
sequence (peak RSS of one step 4.4, 5.6 and 10.4 GiB; the estimate, parameters included, 4.5,
6.2 and 11.8; at its real 49,152 tokens, 233): within about 13 %, meant to tell a run that
fits from one that is off by a multiple, not to budget the last GiB.

On a GPU the same check runs against the device's free memory (each rank has its own GPU).
There the masked kernels (FlexAttention, compiled with the model or on its own, and the varlen
kernel) hold no score matrix; only model.attention.impl=sdpa with a mask does: the boolean mask
and the kernel's bf16 bias from it, MASK_BYTES_CUDA per pair, one layer at a time (not fitted:
the least such a run needs). The activation constant is the CPU's fp32 one, about twice what a
bf16 run keeps, so a GPU refusal means a run off by a multiple.
"""

import os
from dataclasses import dataclass

import torch
from torch import nn

from trainer.config import Config

LINEAR_BYTES = 32  # fp32 activations kept per layer, token and channel (8 values)
SCORE_BYTES = 16  # four fp32 copies of one layer's scores (scores, mask, softmax, grad)
MASK_BYTES_CUDA = 3  # impl=sdpa on a GPU: the boolean mask and its bf16 bias, per pair
GIB = 2**30


@dataclass(frozen=True)
class Estimate:
    """Bytes a run adds to its built parameters on one rank."""

    state: int  # gradients and optimizer state
    activations: int  # kept for backward, one micro-batch
    scores: int  # one layer's materialised attention scores (0: a fused kernel)

    @property
    def total(self) -> int:
        return self.state + self.activations + self.scores


def masked(conf: Config) -> bool:
    """Whether attention needs a (query, key) mask: documents, windows or paired heads."""
    a = conf.model.attention
    return a.document_mask or bool(a.window) or bool(a.paired)


def mask_bytes(conf: Config, rows: int, length: int, device: str = "cpu") -> int:
    """One layer's (query, key) memory for `rows` sequences of `length` tokens: on a CPU
    eager, the scores with the mask (SCORE_BYTES per head and pair), compiled, the dense
    boolean mask the CPU kernel still reads (one byte per pair); on a GPU, MASK_BYTES_CUDA per
    pair with impl=sdpa, else none (block-sparse and flash kernels); 0 without a mask."""
    if not masked(conf):
        return 0
    m = conf.model
    span = 2 * length if m.attention.paired else length  # a paired layer doubles positions
    if device == "cuda":
        per_pair = MASK_BYTES_CUDA if m.attention.impl == "sdpa" else 0
    else:
        per_pair = 1 if m.compile else SCORE_BYTES * m.n_head
    return per_pair * span * span * rows


def estimate(conf: Config, model: nn.Module, world_size: int, device: str = "cpu") -> Estimate:
    """What `conf`'s steps add, per rank, to `model`'s parameters on a `device` of that type
    (module docstring)."""
    params = list(model.parameters())
    grads = sum(p.numel() * p.element_size() for p in params)
    optimizer = sum(2 * 4 * p.numel() for p in params)
    m, t = conf.model, conf.train
    rows = t.micro_batch(world_size)
    activations = LINEAR_BYTES * m.n_layer * m.n_embd * rows * t.seq_len  # the longest stage
    # The evaluation's sequences may be longer than training's (the records': 262,144)
    scores = max(
        mask_bytes(conf, rows, t.seq_len, device),
        mask_bytes(conf, t.val_rows(world_size), t.val_seq_len or t.seq_len, device),
    )
    return Estimate(grads + optimizer, activations, scores)


def available_bytes() -> int | None:
    """The memory this machine can give without swapping (Linux's MemAvailable); None where
    it does not say."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None


def gpu_free_bytes(device: torch.device) -> int:
    """What the GPU `device` has free now (the driver's count, other processes' use
    excluded)."""
    return torch.cuda.mem_get_info(device)[0]


def check_fits(
    conf: Config,
    model: nn.Module,
    world_size: int,
    ranks_here: int,
    device: torch.device | None = None,
) -> None:
    """Raise ValueError (the command line's one-line error), with the numbers, when the run's
    `ranks_here` ranks on this machine (on a GPU: the rank on its device) would need more than
    it has available."""
    gpu = device is not None and device.type == "cuda"
    free = gpu_free_bytes(device) if gpu else available_bytes()
    if free is None:
        return
    e = estimate(conf, model, world_size, "cuda" if gpu else "cpu")
    need = e.total * (1 if gpu else ranks_here)
    if need <= free:
        return
    t = conf.train
    holds = (
        "impl=sdpa on a GPU holds one layer's (query, key) mask and bias; "
        "model.attention.impl=auto runs FlexAttention, which holds none"
        if gpu
        else "a masked attention on a CPU holds one layer's whole (query, key) matrix"
    )
    scores = (
        f", attention scores or mask {e.scores / GIB:.1f} ({holds}, at train.seq_len or "
        "train.val_seq_len)"
        if e.scores
        else ""
    )
    where = "this GPU" if gpu else "this CPU"
    fix = (
        "lower train.seq_len, train.val_seq_len or train.micro_batch_size"
        if gpu
        else "Run it at toy size (README, 'A record preset at toy size'), or lower "
        "train.seq_len or train.micro_batch_size"
    )
    raise ValueError(
        f"this run needs about {need / GIB:.1f} GiB more than its parameters on {where}, which "
        f"has {free / GIB:.1f} GiB available: per rank, gradients and optimizer state "
        f"{e.state / GIB:.1f}, activations {e.activations / GIB:.1f} at train.seq_len="
        f"{t.seq_len} and {t.micro_batch(world_size)} sequence(s) per micro-step{scores}, on "
        f"{1 if gpu else ranks_here} rank(s). {fix[0].upper()}{fix[1:]}"
    )
