"""Train a GPT: `python train.py [overrides]` or `torchrun ... train.py [overrides]`.

Hydra composes `conf/config.yaml` with the command-line overrides; `train(cfg)` does the
work and returns the final validation loss (what a Hydra sweep minimises). Tests call
`train()` directly, with no Hydra in the way. Under torchrun every rank runs this file;
`dist.nproc=N` makes this one process start N ranks itself.
"""

import logging
import os
import shlex
import sys
from pathlib import Path
from typing import NoReturn

import hydra
from omegaconf import DictConfig, OmegaConf
from torch.distributed import ProcessGroup
from torch.distributed.elastic.multiprocessing.errors import record

from data.build import build_data
from model import GPT
from model.flops import StepFlops
from optim import build_optimizer
from trainer.checkpoint_files import CHECKPOINTS_DIR
from trainer.checkpointer import Checkpointer
from trainer.compile import compile_model
from trainer.config import Config, register_configs, to_config
from trainer.dist import agree_on_config, local_main_first, main_decides, process_group, wrap_ddp
from trainer.fault import Faults
from trainer.flops import peak_flops
from trainer.launch import spawn_ranks
from trainer.loop import Loop
from trainer.metrics import METRICS_FILE, MetricsSink, describe_run
from trainer.run_dir import check_writable, env_rank, set_aside_previous
from trainer.runtime import Runtime, init_runtime, seed_everything
from trainer.signals import Stopped, StopRequests
from trainer.strategy import fsdp_no_sync, resolve_param_dtype, shard_model

log = logging.getLogger("train")


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
    run_dir, t = Path(conf.run_dir), conf.train
    saves = [CHECKPOINTS_DIR] if t.checkpoint_every or t.checkpoint_at_end else []
    main_decides(lambda: check_writable(run_dir, *saves), rt)  # raises on every rank
    seed_everything(conf.seed)
    micro = t.batch_size // (rt.world_size * accum_steps)
    val_seq = t.val_seq_len or t.seq_len
    val_rows = max(1, micro * t.seq_len // val_seq)  # a micro-batch's tokens, at least a row
    with local_main_first(rt):  # one rank per node builds the corpus cache
        loader, val_batches = build_data(
            conf.data, batch_size=t.batch_size, seq_len=t.seq_len, val_tokens=t.val_tokens,
            val_batch_size=val_rows * rt.world_size, val_seq_len=val_seq, seed=conf.seed,
            rank=rt.rank, world_size=rt.world_size, progress=rt.is_main,
        )  # fmt: skip
    model = GPT(conf.model).to(rt.device)
    model.micro_steps = accum_steps
    fsdp = conf.dist.strategy == "fsdp"
    if fsdp:  # before the optimizer: its state is sharded like the parameters
        shard_model(model, rt, resolve_param_dtype(conf.dist.fsdp_param_dtype, rt.device))
    optimizer = build_optimizer(
        model, conf.optim, total_steps=t.steps, device=rt.device, process_group=group,
        sharded=fsdp,
    )  # fmt: skip
    checkpoints = Checkpointer(conf, rt, model, optimizer, loader)
    start = checkpoints.resume()  # before DDP: its construction broadcasts the parameters
    if start.step == 0 and rt.is_main:  # a fresh start owns the run directory's records
        moved = set_aside_previous(run_dir, (METRICS_FILE, CHECKPOINTS_DIR))
        if moved is not None:
            log.warning("an earlier run's metrics and checkpoints were moved to %s", moved)
    ddp = wrap_ddp(model, optimizer.self_reduced) if group is not None and not fsdp else None
    no_sync = ddp.no_sync if ddp is not None else fsdp_no_sync(model) if fsdp else None
    fwd = ddp or model
    if conf.model.compile:
        fwd = compile_model(fwd, conf.model.compile_backend)
    sink = MetricsSink.for_run(conf, rt, start, checkpoints.last)
    sink.info("%s", describe_run(conf, rt, model, optimizer.summary, accum_steps))
    with StopRequests() as stop, sink:
        loop = Loop(
            fwd, optimizer, loader.next_batch, val_batches, t, rt, sink, checkpoints,
            accum_steps=accum_steps, no_sync=no_sync,
            stop=stop, hook=Faults(t.fault, rt.rank, run_dir, model) if t.fault.enabled else None,
            flops=StepFlops.of(model),
            peak_flops=peak_flops(rt.device),
        )  # fmt: skip
        return loop.run(start)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
@record  # a failing rank's traceback reaches torchrun's summary
def main(cfg: DictConfig) -> float:
    try:
        conf = to_config(cfg)  # a bad value fails here, before the config dump
        # Into train.log only: the console keeps to what happens (.hydra/ has it too).
        to_log_file(logging.INFO, f"config:\n{OmegaConf.to_yaml(cfg, resolve=True)}")
        return train(conf)
    except Stopped as e:  # a checkpoint is saved: no traceback, the shell's signal status
        if env_rank() == 0:
            log.warning("%s To continue: %s", e, continue_command(conf.run_dir))
        sys.exit(e.exit_code)
    except (ValueError, OSError, FloatingPointError) as e:
        # The project's own checks raise these with a message naming the key or file and
        # the fix: that line is the whole report. Under torchrun @record takes the exception
        # to torchrun's summary instead, and HYDRA_FULL_ERROR=1 shows the traceback.
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or "TORCHELASTIC_RUN_ID" in os.environ:
            raise
        fail(e)


def fail(e: BaseException) -> NoReturn:
    """Print `e` as one line on stderr (and into train.log when the run has one); exit 1."""
    to_log_file(logging.ERROR, f"error: {e}")
    print(f"error: {e} (HYDRA_FULL_ERROR=1 shows the traceback)", file=sys.stderr)
    sys.exit(1)


def to_log_file(level: int, message: str) -> None:
    """Write `message` to the run's log file (rank 0's train.log) but not to the console."""
    record_ = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record_)


def continue_command(run_dir: str) -> str:
    """The command that resumes this run: the same arguments, pinned to its run directory
    (a default run directory is new for every launch, so "the same command" would not do)."""
    args = [a for a in sys.argv[1:] if not a.startswith("hydra.run.dir=")]
    tail = shlex.join([*args, f"hydra.run.dir={run_dir}"])
    if "TORCHELASTIC_RUN_ID" in os.environ:  # this process can't see torchrun's own flags
        return f"the same torchrun command, with train.py {tail}"
    return f"python train.py {tail}"


if __name__ == "__main__":
    register_configs()
    main()
