"""What a checkpoint holds beside the tensors: the trainer's part (the loop's `Progress`, the
loader's global position, every rank's RNG states and the model's per-rank state) and the
metadata (world size, threads, progress at a glance, the config and the code's version), and
how the trainer's part is put back into a run."""

import logging
from dataclasses import asdict
from typing import Any, Protocol

import torch
from torch import nn

from trainer.checkpoint.files import CheckpointError, Loaded
from trainer.checkpoint.upgrade import NAMES
from trainer.config import Config
from trainer.launch.dist import gather
from trainer.observe.progress import Progress
from trainer.observe.provenance import code_version
from trainer.runtime import Runtime, rng_state, set_rng_state

log = logging.getLogger("train")


class Loader(Protocol):
    """The loader interface a checkpoint needs (TokenLoader and SyntheticLoader have it)."""

    def state_dict(self) -> dict[str, int]: ...
    def load_state_dict(self, state: dict[str, int]) -> None: ...


def trainer_state(
    progress: Progress, loader: Loader, rt: Runtime, model: nn.Module | None = None
) -> dict[str, Any]:
    """The trainer's part of a checkpoint of `progress`; a collective (the RNG states of every
    rank are gathered, and the model's per-rank state where it has one: `rank_state()`, the
    FP8 MLP's delayed scales)."""
    rngs = gather(rng_state(rt.device), rt)
    state = {"progress": asdict(progress), "loader": loader.state_dict(), "rng": rngs}
    own = model.rank_state() if hasattr(model, "rank_state") else {}
    if own:  # every rank alike (the same config), so every rank takes part in the gather
        state["model_rank"] = gather(own, rt)
    return state


def metadata(progress: Progress, conf: Config, rt: Runtime) -> dict[str, Any]:
    """meta.json's content: what a run needs to know about a checkpoint before loading it."""
    meta = {
        "world_size": rt.world_size,
        "threads": torch.get_num_threads() if rt.device.type == "cpu" else None,
        "tokens": progress.tokens,
        "train_time_s": progress.train_time_s,
        "val_loss": progress.val_loss,
        "config": asdict(conf),
        "names": NAMES,  # the parameters' naming (trainer/checkpoint/upgrade.py)
    }
    if (code := code_version()) is not None:
        meta["code"] = code
    return meta


def restore_trainer(
    loaded: Loaded, loader: Loader, rt: Runtime, model: nn.Module | None = None
) -> Progress:
    """The loader position, this rank's RNG states and the model's per-rank state
    (`load_rank_state`, which says how it maps saved ranks to this run's) from `loaded`; the
    progress to go on from."""
    trainer = loaded.parts["trainer"]
    try:
        loader.load_state_dict(trainer["loader"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f"{loaded.path}: the saved loader position does not fit this data: {e}"
        ) from e
    rngs = trainer["rng"]
    # Same world size: each rank its own generators; otherwise all take rank 0's, the
    # state every rank starts from (seed_everything seeds all ranks alike).
    same_layout = len(rngs) == rt.world_size
    set_rng_state(rngs[rt.rank] if same_layout else rngs[0], rt.device)
    if hasattr(model, "load_rank_state"):
        note = model.load_rank_state(trainer.get("model_rank", []), rt.rank, rt.world_size)
        if note and rt.is_main:
            log.info("%s", note)
    return Progress(**trainer["progress"])
