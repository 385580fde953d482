"""What `python train.py` does around a run: errors as one line, stops with the command that
continues them, the resolved config into the run's log file."""

import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from omegaconf import DictConfig, OmegaConf

from trainer.cli.overrides import check_command_line
from trainer.cli.sizes import size_without_overlay
from trainer.config import Config, to_config
from trainer.launch.report import ONE_LINE, leave_rank, to_log_file
from trainer.launch.signals import Stopped, claim_signals
from trainer.run_dir import discard_unstarted, env_rank, under_torchelastic

log = logging.getLogger("train")


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
STARTED = time.time()  # before Hydra makes the run directory (this module loads first)


def check_arguments(argv: list[str]) -> None:
    """Check the command line's overrides against the schema and conf/'s options; a bad one
    prints one line (under torchrun: rank 0 alone) and exits 1."""
    try:
        check_command_line(argv, CONF_DIR, Config)
    except ValueError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        fail(e, traceback_hint=False)  # the traceback would show only this check
    if env_rank() == 0 and (warning := size_without_overlay(argv, CONF_DIR)) is not None:
        print(f"warning: {warning}", file=sys.stderr)


def run_main(cfg: DictConfig, train: Callable[[Config], float]) -> float:
    """`train(cfg)` for the command line: a bad value fails before the config dump, a stop
    exits with the signal's status and prints how to continue, and the project's own errors
    (ONE_LINE: they name the key or file and the fix) print as one line and exit 1. Under
    torchrun any other error's traceback goes to torchrun's summary (torch's `record`,
    imported only there: it imports torch)."""
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
    except ONE_LINE as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        # A run that never started leaves no directory (under torchrun rank 0's is the one).
        if env_rank() == 0 and (run_dir := cfg.get("run_dir")):
            discard_unstarted(Path(run_dir), STARTED - 1.0)
        fail(e)


def fail(e: BaseException, traceback_hint: bool = True) -> NoReturn:
    """Print `e` as one line on stderr (and into train.log when the run has one); exit 1.
    Under torchrun rank 0 alone prints it, and every rank leaves it, with no traceback, for
    torchrun's failure summary (trainer/launch/report.py)."""
    to_log_file(logging.ERROR, f"error: {e}")
    hint = " (HYDRA_FULL_ERROR=1 shows the traceback)" if traceback_hint else ""
    line = f"error: {e}{hint}"
    if under_torchelastic():
        leave_rank(e, line if env_rank() == 0 else None)
    print(line, file=sys.stderr)
    sys.exit(1)


def continue_command(run_dir: str) -> str:
    """The command that resumes this run: the same arguments, pinned to its run directory
    (a default run directory is new for every launch, so "the same command" would not do)."""
    args = [a for a in sys.argv[1:] if not a.startswith("hydra.run.dir=")]
    tail = shlex.join([*args, f"hydra.run.dir={run_dir}"])
    if under_torchelastic():  # this process can't see torchrun's own flags
        return f"the same torchrun command, with train.py {tail}"
    return f"{python_command()} train.py {tail}"


def python_command() -> str:
    """How the user's shell calls this interpreter: `python` where that is the one on PATH (an
    active virtualenv, or a plain install), else its path. `make train` runs .venv's python
    without activating it, and a plain `python` there lacks the project's packages."""
    on_path = shutil.which("python")
    # Not resolved: a virtualenv's python is a link to the base interpreter, which lacks them
    here = Path(sys.executable).absolute()
    if on_path is not None and Path(on_path).absolute() == here:
        return "python"
    try:
        return shlex.quote(str(here.relative_to(Path.cwd())))
    except ValueError:
        return shlex.quote(str(here))
