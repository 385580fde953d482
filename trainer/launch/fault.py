"""Test-only fault injection (`train.fault.*`): the failures that checkpoints and the
non-finite guard must survive, through the one hook the loop calls each step.

`Faults` is that hook: the loop calls it once per step, after forward/backward and before the
update, with the step's loss. `kill_at_step` SIGKILLs one rank there, the way the OOM killer or
a lost node does: no handler runs, nothing is flushed, the step is lost. It fires once per run
directory (a marker file remembers it), so the run that resumes and passes the same step again
lives on. `signal_at_step` sends that rank a SIGTERM instead, once, as a scheduler does before
pre-empting a job: the loop sees it in the same step's reduction, finishes the step, saves and
stops. `nonfinite_at_step` makes that step's loss NaN on every rank; `nonfinite_grad_at_step`
makes one gradient NaN under a finite loss. `slow_step_at` holds that rank's main thread for
`slow_step_s` seconds with SIGTERM and SIGINT held off, as one long kernel does (a Python
signal handler runs only once it returns): the case a stop request must still be announced in.
"""

import os
import signal
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from optim.fsdp_rows import local
from trainer.config import FaultConfig

MARKER = ".fault-{}-fired"


class Faults:
    """The step hook of a run with `train.fault.*` set (see the module docstring)."""

    def __init__(self, cfg: FaultConfig, rank: int, run_dir: Path, model: nn.Module) -> None:
        self.cfg, self.rank, self.run_dir = cfg, rank, run_dir
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, step: int, loss: Tensor) -> Tensor:
        c = self.cfg
        if c.nonfinite_at_step == step:
            loss = loss * float("nan")
        if c.nonfinite_grad_at_step == step:
            with torch.no_grad():
                grad = local(next(p for p in self.params if p.grad is not None).grad)
                grad.view(-1)[0] = float("nan")  # this rank's shard under fsdp
        if self.rank == c.rank:
            if c.kill_at_step == step and self._first_time("kill", step):
                os.kill(os.getpid(), signal.SIGKILL)
            if c.signal_at_step == step and self._first_time("signal", step):
                os.kill(os.getpid(), signal.SIGTERM)
            if c.slow_step_at == step:
                _hold(c.slow_step_s)
        return loss

    def _first_time(self, kind: str, step: int) -> bool:
        marker = self.run_dir / MARKER.format(kind)
        if marker.exists():
            return False
        marker.write_text(f"rank {self.rank}: {kind} during step {step}\n")
        return True


def _hold(seconds: float) -> None:
    """Block the main thread `seconds` with SIGTERM and SIGINT masked in it: a signal sent
    meanwhile goes to another thread, and its Python handler waits until this returns."""
    held = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        time.sleep(seconds)
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
