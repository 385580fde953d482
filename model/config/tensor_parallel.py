"""What dist.tensor_parallel can split of a model config: each layer's heads and MLP hidden
units over T ranks (model/tensor_parallel.py). Options that mix heads or read all of them, the
merged q/k/v layouts, and the MLPs other than the dense one are refused naming their key."""

from typing import Any


def check_tensor_parallel(model: Any, size: int) -> None:
    """Raise ValueError naming the key of the model config `model` (ModelConfig) that
    `dist.tensor_parallel=size` can't split."""
    if size == 1:
        return
    if model.n_head % size:
        raise ValueError(
            f"dist.tensor_parallel={size} splits each layer's heads: it must divide "
            f"model.n_head ({model.n_head})"
        )
    att, mlp = model.attention, model.mlp
    refused = {
        "model.attention.merged_qkv": att.merged_qkv,
        "model.attention.merged_qkvo": att.merged_qkvo,
        "model.attention.weight_lambdas": att.weight_lambdas,
        "model.attention.gate": att.gate,
        "model.attention.value_residual": att.value_residual != "off",
        "model.attention.xsa": bool(att.xsa),
        "model.attention.paired": bool(att.paired),
        "model.embed.value_embeds": bool(model.embed.value_embeds),
        "model.residual.mudd": model.residual.mudd,
        "model.mlp.experts": bool(mlp.experts),
        "model.mlp.fp8": mlp.fp8 != "off",
        "model.mlp.fc_in_out": mlp.fc_in_out,
        "model.mlp.proj_in_out": mlp.proj_in_out,
    }
    for key, on in refused.items():
        if on:
            raise ValueError(
                f"dist.tensor_parallel={size} splits attention by heads and the MLP by hidden "
                f"units; {key} works across all of them (model/tensor_parallel.py): turn it off "
                "or leave dist.tensor_parallel=1"
            )
