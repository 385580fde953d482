"""The two layouts a checkpoint's tensors are written in, and reading either into a run.

torch_save (a ddp_* dist.parallelism): rank 0 writes whole tensors. dcp (fsdp): every rank writes
its shards through Distributed Checkpoint (`dcp_state.py`) into rank 0's temporary directory,
then rank 0 adds the trainer's part and meta.json and commits the directory atomically. Either
layout resumes either strategy. Each save raises on every rank if it failed on one; the
previous checkpoint is then still the newest and intact.
"""

import shutil
from pathlib import Path
from typing import Any

from torch import nn

from optim import CombinedOptimizer
from trainer.checkpoint import files
from trainer.checkpoint.dcp_state import (
    load_sharded,
    load_whole_into_sharded,
    read_whole,
    save_sharded,
)
from trainer.checkpoint.files import Loaded
from trainer.checkpoint.upgrade import upgrade_flat, upgrade_parts
from trainer.launch.dist import main_decides, raise_together
from trainer.runtime import Runtime


def save_whole(
    model: nn.Module, optimizer: CombinedOptimizer, rt: Runtime, root: Path, step: int,
    trainer: dict[str, Any], meta: dict[str, Any], keep: int, last: Path | None,
) -> Path:  # fmt: skip
    """Layout torch_save under `root`, keeping the newest `keep`; `last`: the newest good
    checkpoint, named in the error when this save fails."""
    model_state = model.state_dict()
    optim_states = optimizer.state_dict()  # may be a collective
    error, path = None, None
    if rt.is_main:
        parts = {"model": model_state, "optimizers": optim_states, "trainer": trainer}
        try:
            path = files.save(root, step, parts, meta, keep)
        except OSError as e:
            error = save_failed(e, step, root, last)
    raise_together(error, rt, f"saving the checkpoint of step {step}")
    return main_decides(lambda: path, rt)


def save_dcp(
    model: nn.Module, optimizer: CombinedOptimizer, rt: Runtime, root: Path, step: int,
    trainer: dict[str, Any], meta: dict[str, Any], keep: int, last: Path | None,
) -> Path:  # fmt: skip
    """Layout dcp, with the arguments of `save_whole`."""
    tmp = main_decides(lambda: files.begin(root, step), rt)
    error, path = None, None
    try:
        save_sharded(tmp / files.DCP_DIR, model, optimizer)
    except Exception as e:  # DCP raises the failure of any rank on every rank
        error = e
    if error is None and rt.is_main:
        try:
            files.write_part(tmp, "trainer", trainer)
            path = files.commit(root, tmp, step, {**meta, "layout": "dcp"}, keep)
        except OSError as e:
            error = save_failed(e, step, root, last)
    if error is not None and rt.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    raise_together(error, rt, f"saving the checkpoint of step {step}")
    return main_decides(lambda: path, rt)


def save_failed(e: OSError, step: int, root: Path, last: Path | None) -> OSError:
    """The error of a failed save: what failed, where, and the last good checkpoint."""
    where = f"; the last good checkpoint is {last}" if last else ""
    return OSError(
        e.errno,
        f"saving the checkpoint of step {step} under {root} failed: {e.strerror or e}{where}",
    )


def restore_tensors(
    loaded: Loaded, model: nn.Module, optimizer: CombinedOptimizer, sharded: bool
) -> None:
    """Model and optimizer state from either layout into this run's, sharded (fsdp) or whole
    (see dcp_state.py)."""
    meta = loaded.meta  # an older naming's save is read under today's names (upgrade.py)
    if meta.get("layout", "torch_save") == "torch_save":
        parts = upgrade_parts(loaded.parts, meta)
        if sharded:
            load_whole_into_sharded(parts, model, optimizer)
            return
        model.load_state_dict(parts["model"])
        optimizer.load_state_dict(parts["optimizers"])
    elif sharded:
        load_sharded(loaded.path / files.DCP_DIR, model, optimizer, meta)
    else:
        model_state, optim = read_whole(loaded.path / files.DCP_DIR)
        model.load_state_dict(upgrade_flat(model_state, meta, flat=False))
        optimizer.load_flat(upgrade_flat(optim, meta, flat=True))
