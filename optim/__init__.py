"""Optimizers and their schedules: Muon for hidden matrices, AdamW for the rest."""

from optim.build import apply_schedules, build_optimizers, ddp_ignored_params
from optim.muon import Muon
from optim.partition import partition_params

__all__ = [
    "Muon",
    "apply_schedules",
    "build_optimizers",
    "ddp_ignored_params",
    "partition_params",
]
