"""A run's stages: the stage table (`train.stages`) and the rule that places a step in a stage.

The bottom layer: it imports nothing of the project and no torch, and model/, data/, optim/
and trainer/ may all import it, so each reads the current row through the same rule
(stages/table.py) and none keeps a copy of it. stages/moved.py names where the keys of the
former parallel lists went.
"""

from stages.table import Stage, StageTable, stage_index, stage_start

__all__ = ["Stage", "StageTable", "stage_index", "stage_start"]
