"""Optimizers: Muon for hidden matrices (optim/muon/), AdamW for the rest, as one object.

The optimizers are imported on first use (PEP 562), so that reading the config schema
(optim/config.py) does not import torch.
"""

from typing import Any

from optim.config import OptimConfig

__all__ = ["CombinedOptimizer", "Muon", "OptimConfig", "build_optimizer", "partition_params"]

_WHERE = {
    "build_optimizer": "optim.build",
    "CombinedOptimizer": "optim.combined",
    "partition_params": "optim.groups",
    "Muon": "optim.muon.optimizer",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'optim' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_WHERE[name]), name)
