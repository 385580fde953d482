"""How the model is spread over ranks: the model's side of `dist.parallelism`
(optim/parallelism.py; the optimizer's exchange is the other side).

ddp_* (the default ddp_all_gather among them): every rank holds the whole model (and, but for
ddp_owners' and ddp_row_shards' shares, all optimizer state); DDP all-reduces the gradients it
is left. Right while model + optimizer state fit one GPU comfortably (GPT-2 small, medium).

fsdp_gather, fsdp_tp: PyTorch FSDP2 (`fully_shard`) shards every parameter, gradient and
optimizer state over the ranks by dim-0 rows; each unit's parameters are all-gathered just
before its forward and backward and freed after, and gradients are reduce-scattered (averaged)
to their shards. The units: those the model declares (`fsdp_units`: for the GPT every embedding
table and every block), and the root (the LM head and the scalars). Muon then runs sharded
(`optim/muon/fsdp_strategies.py`) and checkpoints are DCP (see
`trainer/checkpoint/checkpointer.py`).
Parameters are all-gathered in `dist.fsdp_param_dtype` (bf16 by default on GPU, halving the
traffic; fp32 on CPU; `resolve_param_dtype` in trainer/runtime.py) and gradients always reduced
in fp32.
"""

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
from torch import nn

from optim.parallelism import check_replicate, check_tensor_parallel
from trainer.runtime import Runtime

# What a module declares on its parameters: the optimizer role and Adam settings, the stack
# a 3-D weight is (optim/muon/stacks.py), the share of an expert stack a token meets (flops)
DECLARED = ("role", "optim_settings", "stack_of", "active_share")


def shard_model(
    model: nn.Module, rt: Runtime, param_dtype: torch.dtype, replicate: int = 1,
    tensor_parallel: int = 1,
) -> nn.Module:  # fmt: skip
    """Apply FSDP2 to `model` in place (its class becomes an FSDP subclass; names unchanged):
    each of `model.fsdp_units()` a unit, the rest the root unit.

    `replicate` (dist.replicate) > 1: an (R, W/R) mesh, each row of W/R ranks one copy of
    the model (HSDP). `tensor_parallel` (dist.tensor_parallel) T > 1: a last mesh dim "tp"
    of T neighbouring ranks, over which each block is split first (model/tensor_parallel.py);
    FSDP2 then shards each piece over the other dims. Needs the default process group (a
    one-rank group for a single process). What a module declared on a parameter
    (`DECLARED`: model/layers.py `declare`) is carried over to the sharded parameter that
    replaces it, so the optimizer sees it as unsharded.
    """
    # FSDP is imported here, when used: it takes ~0.5 s that a DDP run need not pay.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    # only the ranks are news here
    check_replicate(replicate, "fsdp_gather", rt.world_size)
    check_tensor_parallel(tensor_parallel, replicate, "fsdp_gather", rt.world_size)
    shard = rt.world_size // (replicate * tensor_parallel)
    # HSDP: FSDP2 shards over "shard" and all-reduces over "replicate"; TP splits over "tp"
    dims = [("replicate", replicate), ("shard", shard), ("tp", tensor_parallel)]
    kept = [(name, n) for name, n in dims if n > 1 or name == "shard"]
    names, shape = tuple(name for name, _ in kept), tuple(n for _, n in kept)
    mesh = init_device_mesh(rt.device.type, shape, mesh_dim_names=names)
    declared = {n: {a: getattr(p, a) for a in DECLARED if hasattr(p, a)}
                for n, p in model.named_parameters()}  # fmt: skip
    if tensor_parallel > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], model.tp_plan())
        mesh = mesh[tuple(n for n in names if n != "tp")]
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for unit in model.fsdp_units():  # the model declares its units; the rest is the root's
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for name, p in model.named_parameters():
        for attribute, value in declared.get(name, {}).items():
            setattr(p, attribute, value)
    return model


def fsdp_no_sync(model: nn.Module) -> Callable[[], AbstractContextManager]:
    """The `no_sync` of an FSDP2 model: micro-steps inside it keep their gradients unsharded
    and unreduced; the last micro-step, outside it, reduce-scatters the accumulated sum once."""
    from torch.distributed.fsdp import FSDPModule

    assert isinstance(model, FSDPModule)

    @contextmanager
    def no_sync() -> Iterator[None]:
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    return no_sync
