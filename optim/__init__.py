"""Optimizers: Muon for hidden matrices (optim/muon/), AdamW for the rest, as one object."""

from optim.build import build_optimizer
from optim.combined import CombinedOptimizer
from optim.config import OptimConfig
from optim.groups import partition_params
from optim.muon.optimizer import Muon

__all__ = ["CombinedOptimizer", "Muon", "OptimConfig", "build_optimizer", "partition_params"]
