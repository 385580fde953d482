"""`Checkpointer`: what a checkpoint holds, and how every rank takes part in saving and
resuming one. (The files on disk and their atomic layout: `checkpoint_files.py`.)

A checkpoint is the union of the state each owner keeps: the model's parameters (the
unwrapped module, so names carry no DDP or compile prefix), the optimizer object's state, the
loader's global position, every rank's RNG states and the loop's `Progress`. Resuming loads
each back, so the run continues as if it had never stopped.

Everything saved is independent of the world size: momentum is replicated (or gathered by
Muon's `state_dict()`, a collective in exchange=reduce_scatter mode, which is why every rank
calls `save`), and the loader position counts global tokens. A checkpoint from W ranks
therefore resumes on W' ranks. Under dist.strategy=ddp rank 0 alone writes files (layout
torch_save); under fsdp every rank writes its shards through Distributed Checkpoint (layout
dcp, `dcp_state.py`), and either layout resumes either strategy. Every rank reads, so a
multi-node run needs its run directory on a shared filesystem.
"""

import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
from omegaconf import OmegaConf
from torch import nn

from optim import CombinedOptimizer
from trainer.checkpoint import files
from trainer.checkpoint.dcp_state import (
    load_sharded,
    load_whole_into_sharded,
    read_whole,
    save_sharded,
)
from trainer.checkpoint.files import CheckpointError, Loaded
from trainer.checkpoint.resume_rules import resume_rule, upgrade_saved
from trainer.config import Config
from trainer.config_checks import flatten
from trainer.launch.dist import main_decides, raise_together
from trainer.observe.progress import Progress
from trainer.observe.provenance import code_version
from trainer.runtime import Runtime, rng_state, set_rng_state

log = logging.getLogger("train")


class Loader(Protocol):
    """The loader interface a checkpoint needs (TokenLoader and SyntheticLoader have it)."""

    def state_dict(self) -> dict[str, int]: ...
    def load_state_dict(self, state: dict[str, int]) -> None: ...


class Checkpointer:
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
        self.sharded = conf.dist.strategy == "fsdp"  # layout dcp, else torch_save

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
            self._check_config(loaded)
            progress = self._restore(loaded)
        except Exception as e:  # raised on every rank by raise_together
            error = e
        raise_together(error, self.rt, f"resuming from {path}")
        self.last = path
        if self.rt.is_main:
            log.info(
                "resumed from %s: step %d, %d tokens, train time %.1fs (saved on %s, running "
                "on %s)",
                path,
                progress.step,
                progress.tokens,
                progress.train_time_s,
                _ranks(loaded.meta.get("world_size")),
                _ranks(self.rt.world_size),
            )
            self._check_threads(loaded)
        return progress

    def _check_threads(self, loaded: Loaded) -> None:
        """Say so when a CPU run resumes on another number of torch threads per rank: the
        bitwise promise of a resume (README, "Exact resume") holds for the same one."""
        saved, now = loaded.meta.get("threads"), torch.get_num_threads()
        if self.rt.device.type != "cpu" or saved is None or saved == now:
            return
        log.warning(
            "this run computes with %d torch thread(s) per rank, the checkpoint's with %d: on "
            "some CPUs a kernel's sums depend on the thread count, so the losses may differ in "
            "their last bits from a run that never stopped. train.threads=%d matches it.",
            now, saved, saved,
        )  # fmt: skip

    def save(self, progress: Progress) -> Path:
        """Write a checkpoint of `progress`; a collective: every rank must call it.

        Raises on every rank if rank 0 could not write it (disk full, I/O error); the previous
        checkpoint is then still the newest and intact.
        """
        t0 = time.perf_counter()
        rngs = _gather(rng_state(self.rt.device), self.rt)
        trainer = {
            "progress": asdict(progress),
            "loader": self.loader.state_dict(),
            "rng": rngs,
        }
        meta = {
            "world_size": self.rt.world_size,
            "threads": torch.get_num_threads() if self.rt.device.type == "cpu" else None,
            "tokens": progress.tokens,
            "train_time_s": progress.train_time_s,
            "val_loss": progress.val_loss,
            "config": asdict(self.conf),
        }
        if (code := code_version()) is not None:
            meta["code"] = code
        if self.sharded:
            path = self._save_sharded(progress.step, trainer, meta)
        else:
            path = self._save_whole(progress.step, trainer, meta)
        self.last = path
        if self.rt.is_main:
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            log.info(
                "checkpoint step %d: %s (%.1f MB in %.0f ms)",
                progress.step,
                path,
                size / 1e6,
                (time.perf_counter() - t0) * 1000,
            )
        return path

    def _save_whole(self, step: int, trainer: dict, meta: dict) -> Path:
        """Layout torch_save: rank 0 writes whole tensors."""
        model_state = self.model.state_dict()
        optim_states = self.optimizer.state_dict()  # may be a collective
        error, path = None, None
        if self.rt.is_main:
            parts = {"model": model_state, "optimizers": optim_states, "trainer": trainer}
            try:
                path = files.save(self.root, step, parts, meta, self.conf.train.checkpoint_keep)
            except OSError as e:
                error = self._save_error(e, step)
        raise_together(error, self.rt, f"saving the checkpoint of step {step}")
        return main_decides(lambda: path, self.rt)

    def _save_sharded(self, step: int, trainer: dict, meta: dict) -> Path:
        """Layout dcp: every rank writes its shards into rank 0's temporary directory, then
        rank 0 adds trainer.pt and meta.json and commits the directory atomically."""
        tmp = main_decides(lambda: files.begin(self.root, step), self.rt)
        error, path = None, None
        try:
            save_sharded(tmp / files.DCP_DIR, self.model, self.optimizer)
        except Exception as e:  # DCP raises the failure of any rank on every rank
            error = e
        if error is None and self.rt.is_main:
            try:
                files.write_part(tmp, "trainer", trainer)
                keep = self.conf.train.checkpoint_keep
                path = files.commit(self.root, tmp, step, {**meta, "layout": "dcp"}, keep)
            except OSError as e:
                error = self._save_error(e, step)
        if error is not None and self.rt.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise_together(error, self.rt, f"saving the checkpoint of step {step}")
        return main_decides(lambda: path, self.rt)

    def _save_error(self, e: OSError, step: int) -> OSError:
        where = f"; the last good checkpoint is {self.last}" if self.last else ""
        return OSError(
            e.errno,
            f"saving the checkpoint of step {step} under {self.root} failed: "
            f"{e.strerror or e}{where}",
        )

    def _check_config(self, loaded: Loaded) -> None:
        saved = flatten(upgrade_saved(loaded.meta.get("config", {})))
        current = flatten(asdict(self.conf))
        # A key the saved config lacks is a setting added since that save: the code that wrote
        # it behaved as the setting's default does (every new option is off by default).
        defaults = flatten(OmegaConf.to_container(OmegaConf.structured(Config)))
        saved |= {k: defaults[k] for k in current.keys() - saved.keys() if k in defaults}
        differ = sorted(k for k in saved.keys() | current.keys() if saved.get(k) != current.get(k))
        # Each key's rule is its field's `resume` metadata (trainer/config.py).
        fatal = [k for k in differ if resume_rule(k) == "must_match"]
        if fatal:
            shown = "; ".join(f"{k}: {saved.get(k)!r} saved, {current.get(k)!r} now" for k in fatal)
            raise CheckpointError(
                f"checkpoint {loaded.path} was saved with an incompatible config ({shown}). "
                f"Resume with the checkpoint's values (all in {loaded.path / files.META}) "
                "or start fresh with train.resume=never"
            )
        changed = [k for k in differ if resume_rule(k) is None]
        if changed and self.rt.is_main:
            log.warning(
                "resuming with values that differ from the checkpoint's; the run continues "
                "under the new ones: %s",
                "; ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed),
            )

    def _restore(self, loaded: Loaded) -> Progress:
        parts = loaded.parts
        try:
            self._restore_tensors(loaded)
        except ValueError as e:
            raise CheckpointError(f"{loaded.path}: {e}") from e
        trainer = parts["trainer"]
        try:
            self.loader.load_state_dict(trainer["loader"])
        except (KeyError, ValueError) as e:
            raise CheckpointError(
                f"{loaded.path}: the saved loader position does not fit this data: {e}"
            ) from e
        rngs = trainer["rng"]
        # Same world size: each rank its own generators; otherwise all take rank 0's, the
        # state every rank starts from (seed_everything seeds all ranks alike).
        same_layout = len(rngs) == self.rt.world_size
        set_rng_state(rngs[self.rt.rank] if same_layout else rngs[0], self.rt.device)
        return Progress(**trainer["progress"])

    def _restore_tensors(self, loaded: Loaded) -> None:
        """Model and optimizer state from either layout into this run's (see dcp_state.py)."""
        if loaded.meta.get("layout", "torch_save") == "torch_save":
            if self.sharded:
                load_whole_into_sharded(loaded.parts, self.model, self.optimizer)
                return
            self.model.load_state_dict(loaded.parts["model"])
            self.optimizer.load_state_dict(loaded.parts["optimizers"])
        elif self.sharded:
            load_sharded(loaded.path / files.DCP_DIR, self.model, self.optimizer)
        else:
            model, optim = read_whole(loaded.path / files.DCP_DIR)
            self.model.load_state_dict(model)
            self.optimizer.load_flat(optim)


def _ranks(n: int | None) -> str:
    return "an unknown number of ranks" if n is None else f"{n} rank" + ("s" if n != 1 else "")


def _gather(obj: Any, rt: Runtime) -> list[Any]:
    """`obj` from every rank, in rank order (on every rank)."""
    if rt.world_size == 1:
        return [obj]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, obj)
    return out
