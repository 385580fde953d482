"""What `python train.py` does around a run: errors as one line, stops with the command that
continues them, the resolved config into the run's log file."""

import logging
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf

from trainer.cli.overrides import check_command_line
from trainer.config import Config, to_config
from trainer.launch.signals import Stopped, claim_signals
from trainer.run_dir import discard_unstarted, env_rank, under_torchelastic

log = logging.getLogger("train")


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
STARTED = time.time()  # before Hydra makes the run directory (this module loads first)


def check_arguments(argv: list[str]) -> None:
    """Check the command line's overrides against the schema and conf/'s options; a bad one
    prints one line and exits 1. Under torchrun it raises, through torch's `record`, so that
    torchrun's summary names the error as it does for the run's own."""
    if under_torchelastic():
        from torch.distributed.elastic.multiprocessing.errors import record

        record(check_command_line)(argv, CONF_DIR, Config)
        return
    try:
        check_command_line(argv, CONF_DIR, Config)
    except ValueError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        fail(e, traceback_hint=False)  # the traceback would show only this check


def run_main(cfg: DictConfig, train: Callable[[Config], float]) -> float:
    """`train(cfg)` for the command line: a bad value fails before the config dump, a stop
    exits with the signal's status and prints how to continue, and the project's own errors
    (ValueError, OSError, FloatingPointError: they name the key or file and the fix) print as
    one line and exit 1. Under torchrun a failing rank's traceback goes to torchrun's summary
    (torch's `record`, imported only there: it imports torch)."""
    if under_torchelastic():
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(_run_main)(cfg, train)
    return _run_main(cfg, train)


def _run_main(cfg: DictConfig, train: Callable[[Config], float]) -> float:
    claim_signals()  # this process is the run: SIGTERM/SIGINT stop it at a safe point
    try:
        conf = to_config(cfg)  # a bad value fails here, before the config dump
        # Into train.log only: the console keeps to what happens (.hydra/ has it too).
        to_log_file(logging.INFO, f"config:\n{OmegaConf.to_yaml(cfg, resolve=True)}")
        return train(conf)
    except Stopped as e:  # a checkpoint is saved: no traceback, the shell's signal status
        if env_rank() == 0 and e.resumable:
            log.warning("%s To continue: %s", e, continue_command(conf.run_dir))
        elif env_rank() == 0:
            log.warning("%s", e)
        sys.exit(e.exit_code)
    except (ValueError, OSError, FloatingPointError) as e:
        # Under torchrun `record` takes the exception to torchrun's summary instead, and
        # HYDRA_FULL_ERROR=1 shows the traceback.
        if os.environ.get("HYDRA_FULL_ERROR") == "1" or under_torchelastic():
            raise
        if run_dir := cfg.get("run_dir"):  # a run that never started leaves no directory
            discard_unstarted(Path(run_dir), STARTED - 1.0)
        fail(e)


def fail(e: BaseException, traceback_hint: bool = True) -> NoReturn:
    """Print `e` as one line on stderr (and into train.log when the run has one); exit 1."""
    to_log_file(logging.ERROR, f"error: {e}")
    hint = " (HYDRA_FULL_ERROR=1 shows the traceback)" if traceback_hint else ""
    print(f"error: {e}{hint}", file=sys.stderr)
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
    if under_torchelastic():  # this process can't see torchrun's own flags
        return f"the same torchrun command, with train.py {tail}"
    return f"python train.py {tail}"
