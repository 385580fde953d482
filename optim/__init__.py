"""Optimizers and their schedules: Muon for hidden matrices, AdamW for the rest."""

from optim.build import apply_schedules, build_optimizers
from optim.muon import Muon
from optim.partition import partition_params

__all__ = ["Muon", "apply_schedules", "build_optimizers", "partition_params"]
