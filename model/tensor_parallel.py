"""Tensor parallelism over the GPT's blocks (dist.tensor_parallel=T): each block's heads and
MLP hidden units split over T ranks that read the same batch, as Megatron-LM splits them.

    attention  W_q, W_k, W_v column-parallel: a rank computes H/T heads from its rows of them;
               W_o row-parallel: its columns of those heads, the T partial outputs summed
    MLP        fc column-parallel (4d/T hidden units a rank), proj row-parallel

with torch's `ColwiseParallel` and `RowwiseParallel` (`plan`, applied by
trainer/launch/strategy.py before FSDP2 shards each piece further). The residual stream, the
embeddings, the norms and the head stay whole on every rank of a TP group; a block costs
one all-reduce of the (B, T, d) stream after each of its two sublayers forward, and one
before each backward. The attention core takes the local heads as a whole model's: it shapes
heads from the projection's width (model/attention.py).

What splits by heads must do only per-head work there. The options that mix heads or read
all of them, the merged q/k/v layouts and the other MLPs are refused naming the key, before
any work (model/config/tensor_parallel.py; QK-clip's per-head maxima in the trainer's checks
across groups). `GPT.tp_plan` gives the plan.
"""

from typing import Any

from torch import nn


def plan(model: nn.Module) -> dict[str, Any]:
    """`parallelize_module`'s plan for the GPT `model`: per block, q, k, v and fc
    column-parallel, o and proj row-parallel. A block's attention or MLP that is not the
    plain kind (a layout `check` refuses, met here all the same) raises ValueError."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from model.attention import SeparateAttention
    from model.layers import MLP

    out: dict[str, Any] = {}
    for i, block in enumerate(model.blocks):
        if block.attn is not None:
            if type(block.attn) is not SeparateAttention:
                raise ValueError(
                    f"dist.tensor_parallel splits W_q, W_k, W_v, W_o as four linears; layer "
                    f"{i}'s attention is {type(block.attn).__name__}"
                )
            for name in ("q", "k", "v"):
                out[f"blocks.{i}.attn.{name}"] = ColwiseParallel()
            out[f"blocks.{i}.attn.o"] = RowwiseParallel()
        if block.mlp is not None:
            if type(block.mlp) is not MLP or not isinstance(block.mlp.fc, nn.Linear):
                raise ValueError(
                    f"dist.tensor_parallel splits the dense MLP's fc and proj linears; layer "
                    f"{i}'s MLP is {type(block.mlp).__name__}"
                )
            out[f"blocks.{i}.mlp.fc"] = ColwiseParallel()
            out[f"blocks.{i}.mlp.proj"] = RowwiseParallel()
    return out
