"""Test-only fault injection (`train.fault.*`): the crashes that checkpoints must survive.

`kill_at_step` SIGKILLs one rank right after that step, the way the OOM killer or a lost
node does: no handler runs, nothing is flushed. It fires once per run directory (a marker
file remembers it), so the run that resumes and passes the same step again lives on.
`signal_at_step` sends that rank a SIGTERM instead, once, as a scheduler does before
pre-empting a job. `nonfinite_at_step` turns that step's loss into NaN on every rank.
"""

import os
import signal
from pathlib import Path

from trainer.config import FaultConfig

MARKER = ".fault-{}-fired"


class Faults:
    def __init__(self, cfg: FaultConfig, rank: int, run_dir: Path) -> None:
        self.cfg, self.rank, self.run_dir = cfg, rank, run_dir

    def poisons(self, step: int) -> bool:
        """Whether this step's loss is to be made non-finite."""
        return self.cfg.nonfinite_at_step == step

    def after_step(self, step: int) -> None:
        if self.rank != self.cfg.rank:
            return
        if self.cfg.kill_at_step == step and self._first_time("kill", step):
            os.kill(os.getpid(), signal.SIGKILL)
        if self.cfg.signal_at_step == step and self._first_time("signal", step):
            os.kill(os.getpid(), signal.SIGTERM)

    def _first_time(self, kind: str, step: int) -> bool:
        marker = self.run_dir / MARKER.format(kind)
        if marker.exists():
            return False
        marker.write_text(f"rank {self.rank}: {kind} after step {step}\n")
        return True
