"""Train a GPT: `python train.py [overrides]` or `torchrun ... train.py [overrides]`.

Hydra composes `conf/config.yaml` with the command-line overrides; `train(cfg)` does the
work and returns the final validation loss (what a Hydra sweep minimises). Tests call
`train()` directly, with no Hydra in the way. Under torchrun every rank runs this file;
`dist.nproc=N` makes this one process start N ranks itself.
"""

import logging
import os
import sys
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig, OmegaConf
from torch.distributed import ProcessGroup
from torch.distributed.elastic.multiprocessing.errors import record

from data.build import build_data
from model import GPT
from optim import build_optimizers, ddp_ignored_params
from trainer import loop
from trainer.checkpoint import CHECKPOINTS_DIR
from trainer.config import Config, register_configs, to_config
from trainer.dist import (
    agree_on_config,
    local_main_first,
    process_group,
    raise_together,
    wrap_ddp,
)
from trainer.fault import Faults
from trainer.launch import env_rank, spawn_ranks
from trainer.metrics import METRICS_FILE, MetricsSink, describe_run
from trainer.runtime import Runtime, init_runtime, resolve_ns_dtype, seed_everything
from trainer.signals import Stopped, StopRequests
from trainer.snapshot import Checkpointer
from trainer.wandb_log import WandbRun

log = logging.getLogger("train")


def check_writable(run_dir: Path) -> None:
    """Fail before any work if the run directory can't take our files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise PermissionError(f"run_dir {str(run_dir)!r} is not writable: {e}") from e


def train(cfg: DictConfig | Config) -> float:
    """Build everything from `cfg`, train, and return the final validation loss."""
    conf = to_config(cfg)  # validates every value before any work
    if conf.dist.nproc > 1:
        return spawn_ranks(conf, train_rank)
    return train_rank(conf)


def train_rank(conf: Config) -> float:
    """This rank's share of the run (the whole run in a single process)."""
    rt = init_runtime(conf.train.device, conf.train.autocast)
    accum_steps = conf.train.accumulation_steps(rt.world_size)  # fails before any work
    with process_group(rt, conf.dist) as group:
        conf = agree_on_config(conf, rt)
        return _train(conf, rt, group, accum_steps)


def _train(conf: Config, rt: Runtime, group: ProcessGroup | None, accum_steps: int) -> float:
    run_dir = Path(conf.run_dir)
    t = conf.train
    error = None
    if rt.is_main:
        try:
            check_writable(run_dir)
            if t.checkpoint_every or t.checkpoint_at_end:
                check_writable(run_dir / CHECKPOINTS_DIR)
        except OSError as e:
            error = e
    raise_together(error, rt, "checking the run directory")
    seed_everything(conf.seed)
    micro = t.batch_size // (rt.world_size * accum_steps)
    with local_main_first(rt):  # one rank per node builds the corpus cache
        train_loader, val_batches = build_data(
            conf.data,
            batch_size=t.batch_size,
            seq_len=t.seq_len,
            val_tokens=t.val_tokens,
            val_batch_size=micro * rt.world_size,
            seed=conf.seed,
            rank=rt.rank,
            world_size=rt.world_size,
            progress=rt.is_main,
        )
    model = GPT(conf.model).to(rt.device)
    ns_dtype = resolve_ns_dtype(conf.optim.muon.ns_dtype, rt.device)
    optimizers = build_optimizers(model, conf.optim, rt.device.type, ns_dtype, group)
    checkpoints = Checkpointer(conf, rt, model, optimizers, train_loader)
    start = checkpoints.resume()  # before DDP: its construction broadcasts the parameters
    ddp = wrap_ddp(model, ddp_ignored_params(model, conf.optim)) if group is not None else None
    fwd = ddp or model
    fwd = torch.compile(fwd) if conf.model.compile else fwd
    history = checkpoints.last.parents[1] / METRICS_FILE if checkpoints.last else None
    wandb = WandbRun(conf, start.run_id) if rt.is_main and conf.logging.wandb.enabled else None
    sink = MetricsSink(run_dir, rt.is_main, start.step, history, wandb)
    sink.info("%s", describe_run(conf, rt, model, ns_dtype, accum_steps))
    with StopRequests() as stop, sink:
        return loop.run(
            fwd,
            optimizers,
            train_loader.next_batch,
            val_batches,
            t,
            conf.optim,
            rt,
            sink,
            accum_steps=accum_steps,
            no_sync=ddp.no_sync if ddp is not None else None,
            start=start,
            checkpoints=checkpoints,
            stop=stop,
            faults=Faults(t.fault, rt.rank, run_dir),
        )


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@record  # a failing rank's traceback reaches torchrun's summary
def main(cfg: DictConfig) -> float:
    log.info("config:\n%s", OmegaConf.to_yaml(cfg))
    try:
        return train(cfg)
    except Stopped as e:  # a checkpoint is saved: no traceback, the shell's signal status
        if env_rank() == 0:
            log.warning("%s", e)
        sys.exit(e.exit_code)


if __name__ == "__main__":
    register_configs()
    main()
