"""Optimizers and their schedules: Muon for hidden matrices, AdamW for the rest."""

from optim.build import build_optimizer
from optim.combined import CombinedOptimizer
from optim.config import OptimConfig
from optim.muon import Muon
from optim.partition import partition_params

__all__ = ["CombinedOptimizer", "Muon", "OptimConfig", "build_optimizer", "partition_params"]
