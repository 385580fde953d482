"""Model and optimizer state through Distributed Checkpoint (DCP), and across layouts.

A sharded run (dist.parallelism=fsdp_*) saves one flat DCP state: "model/<name>" for every
parameter (the FSDP2 DTensor shards) and "optim/<group>/<parameter>/<key>" for every
optimizer state tensor (`optim/flat_state.py`). Every rank writes its own shards; DCP records
each one's global shape and offsets, so any world size can load it: a sharded run loads in
place into its own shards (DCP reads the overlapping pieces), a whole-tensor (DDP) run loads
whole tensors sized from the checkpoint's metadata.

Both directions between layouts work: a DDP (torch_save) checkpoint resumes an FSDP run, each
rank copying its rows out of the whole tensors, and an FSDP (dcp) checkpoint resumes a DDP
run. (A DDP run with dist.parallelism=ddp_owners keeps momentum on owners only; it loads such
state through its own `load_state_dict`, which keeps each rank's share.)
"""

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from optim import CombinedOptimizer
from optim.flat_state import copy_global, from_positional
from trainer.checkpoint.upgrade import saved_keys

MODEL, OPTIM = "model/", "optim/"


def live_state(model: nn.Module, optimizer: CombinedOptimizer) -> dict[str, Tensor]:
    """The run's own tensors under their DCP names (call inside `optimizer.resident()`)."""
    state = {MODEL + k: v for k, v in model.state_dict().items()}
    state.update({OPTIM + k: v for k, v in optimizer.flat_state().items()})
    return state


def save_sharded(directory: Path, model: nn.Module, optimizer: CombinedOptimizer) -> None:
    """Write this rank's shards of the model and optimizer state (a collective)."""
    import torch.distributed.checkpoint as dcp  # ~0.5 s of imports, for fsdp runs only

    with optimizer.resident():
        dcp.save(live_state(model, optimizer), checkpoint_id=directory)


def load_sharded(
    directory: Path, model: nn.Module, optimizer: CombinedOptimizer, meta: dict[str, Any]
) -> None:
    """Load a dcp save into this run's tensors in place, whatever world size wrote it; its
    meta.json's `meta` (an older naming's keys are read as the save holds them)."""
    import torch.distributed.checkpoint as dcp  # ~0.5 s of imports, for fsdp runs only

    with optimizer.resident():
        target = saved_keys(live_state(model, optimizer), meta, MODEL, OPTIM)
        _check_keys(directory, target.keys())
        dcp.load(target, checkpoint_id=directory)


def read_whole(directory: Path) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Every tensor of a dcp save as a whole CPU tensor: (model state, flat optimizer state).

    Each process reads on its own (no collective), as DDP ranks read a torch_save file.
    """
    import torch.distributed.checkpoint as dcp  # ~0.5 s of imports, for fsdp runs only
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = dcp.FileSystemReader(str(directory)).read_metadata()
    target = {
        key: torch.empty(m.size, dtype=m.properties.dtype)
        for key, m in metadata.state_dict_metadata.items()
        if isinstance(m, TensorStorageMetadata)
    }
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(target, checkpoint_id=directory, no_dist=True)
    model = {k[len(MODEL) :]: v for k, v in target.items() if k.startswith(MODEL)}
    optim = {k[len(OPTIM) :]: v for k, v in target.items() if k.startswith(OPTIM)}
    return model, optim


def load_whole_into_sharded(
    parts: dict[str, Any], model: nn.Module, optimizer: CombinedOptimizer
) -> None:
    """Load a torch_save checkpoint's whole tensors into a sharded run: each rank takes its
    rows of every parameter and state tensor."""
    live = model.state_dict()
    saved = parts["model"]
    if live.keys() != saved.keys():
        differ = sorted(live.keys() ^ saved.keys())[:3]
        raise ValueError(f"the saved model's parameters differ from this model's: {differ}")
    for key, target in live.items():
        copy_global(target, saved[key])
    optimizer.load_flat(from_positional(optimizer.parts, parts["optimizers"]))


def _check_keys(directory: Path, wanted: Any) -> None:
    """Name the tensors this run needs that the save lacks (DCP's own error is a KeyError
    deep in its planner)."""
    import torch.distributed.checkpoint as dcp  # ~0.5 s of imports, for fsdp runs only

    saved = dcp.FileSystemReader(str(directory)).read_metadata().state_dict_metadata
    missing = sorted(set(wanted) - saved.keys())
    if missing:
        raise ValueError(
            f"{directory} lacks {len(missing)} tensors this run needs, e.g. {missing[:3]}"
        )


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
