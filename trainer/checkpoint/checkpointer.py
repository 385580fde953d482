"""`Checkpointer`: what a checkpoint holds, and how every rank takes part in saving and
resuming one. (The files on disk and their atomic layout: `files.py`.)

A checkpoint is the union of the state each owner keeps: the model's parameters (the
unwrapped module, so names carry no DDP or compile prefix), the optimizer object's state, the
loader's global position, every rank's RNG states and the loop's `Progress`. Resuming loads
each back, so the run continues as if it had never stopped.

Everything saved is independent of the world size: momentum is replicated (or gathered by
Muon's `state_dict()`, a collective under dist.parallelism=ddp_owners, which is why every rank
calls `save`), and the loader position counts global tokens. A checkpoint from W ranks
therefore resumes on W' ranks. Under a ddp_* dist.parallelism rank 0 alone writes files (layout
torch_save); under fsdp every rank writes its shards through Distributed Checkpoint (layout
dcp, `layouts.py`), and either layout resumes under any parallelism. Every rank reads, so a
multi-node run needs its run directory on a shared filesystem.
"""

import time
from pathlib import Path

from torch import nn

from optim import CombinedOptimizer
from optim.parallelism import PARALLELISMS
from trainer.checkpoint import files
from trainer.checkpoint.files import CheckpointError, Loaded
from trainer.checkpoint.layouts import restore_tensors, save_dcp, save_whole
from trainer.checkpoint.report import log_resumed, log_saved
from trainer.checkpoint.resume_rules import check_config
from trainer.checkpoint.state import Loader, metadata, restore_trainer, trainer_state
from trainer.config import Config
from trainer.launch.dist import main_decides, raise_together
from trainer.observe.progress import Progress
from trainer.runtime import Runtime


class Checkpointer:
    """A run's checkpoints under <run_dir>/checkpoints, saved and resumed by every rank.

    `resume()`: rank 0 finds what `train.resume` names (`files.resolve`); every rank loads it,
    checks its config against the run's (`resume_rules.check_config`), loads the model and
    optimizer state from either layout (`layouts.restore_tensors`) and then the loader
    position, RNG states and progress (`state.restore_trainer`); all raise if any failed.
    Rank 0 says where it resumed from (`report.py`).

    `save(progress)`: gather the trainer's part (every rank's RNGs) and the metadata
    (`state.py`), write both with the tensors in this run's layout (`layouts.save_whole` or
    `layouts.save_dcp`), and rank 0 says so.
    """

    def __init__(
        self,
        conf: Config,
        rt: Runtime,
        model: nn.Module,
        optimizer: CombinedOptimizer,
        loader: Loader,
    ) -> None:
        self.conf, self.rt = conf, rt
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.root = Path(conf.run_dir) / files.CHECKPOINTS_DIR
        self.last: Path | None = None  # the newest checkpoint saved or resumed from
        self.sharded = PARALLELISMS[conf.dist.parallelism].fsdp  # layout dcp, else torch_save

    def resume(self) -> Progress:
        """Load what `train.resume` names into the model, optimizers, loader and RNGs.

        Returns the progress to continue from (a fresh one when there is nothing to resume).
        Every rank raises if any fails, before any training.
        """
        setting = self.conf.train.resume
        path = main_decides(lambda: files.resolve(setting, Path(self.conf.run_dir)), self.rt)
        if path is None:
            return Progress()
        error, progress = None, Progress()
        try:
            loaded = files.load(path)
            check_config(loaded, self.conf, warn=self.rt.is_main)
            progress = self._restore(loaded)
        except Exception as e:  # raised on every rank by raise_together
            error = e
        raise_together(error, self.rt, f"resuming from {path}")
        self.last = path
        if self.rt.is_main:
            log_resumed(path, progress, loaded.meta, self.rt)
        return progress

    def _restore(self, loaded: Loaded) -> Progress:
        try:
            restore_tensors(loaded, self.model, self.optimizer, self.sharded)
        except ValueError as e:
            raise CheckpointError(f"{loaded.path}: {e}") from e
        return restore_trainer(loaded, self.loader, self.rt, self.model)

    def save(self, progress: Progress) -> Path:
        """Write a checkpoint of `progress`; a collective: every rank must call it.

        Raises on every rank if rank 0 could not write it (disk full, I/O error); the previous
        checkpoint is then still the newest and intact.
        """
        t0 = time.perf_counter()
        trainer = trainer_state(progress, self.loader, self.rt, self.model)
        meta = metadata(progress, self.conf, self.rt)
        write = save_dcp if self.sharded else save_whole
        keep = self.conf.train.checkpoint_keep
        self.last = write(
            self.model, self.optimizer, self.rt, self.root, progress.step, trainer, meta, keep,
            self.last,
        )  # fmt: skip
        if self.rt.is_main:
            log_saved(progress.step, self.last, t0)
        return self.last
