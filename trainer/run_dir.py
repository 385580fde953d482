"""One run directory per launch, whichever rank asks: the resolvers `conf/config.yaml` uses.

Under torchrun every rank runs `@hydra.main`, so every rank would pick a run directory and
write `.hydra/` and a log into it. The resolvers here make that rank-aware: rank 0 gets
`outputs/<date>/<time>` of the moment the *launch* started (for torchrun, the start of the
torchrun process that is every local rank's parent, so a restart by `--max-restarts` returns
to the same directory and finds its checkpoints); other ranks get `.` (the working directory,
which exists) and write no `.hydra/` and no log file, so they create nothing.
`trainer.launch.dist.agree_on_config` then hands them rank 0's directory.
"""

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf


def env_rank() -> int:
    """This process's global rank as torchrun set it (0 when not launched by torchrun)."""
    return int(os.environ.get("RANK", "0"))


def under_torchelastic() -> bool:
    """Whether torchrun (or torch's elastic agent) started this process."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def launch_start_time() -> datetime | None:
    """When this launch began: torchrun's start for its workers, else now.

    None when it can't be known the same way by a restarted worker: under torchrun across
    several nodes (rank 0's parent may differ after a restart) or where /proc is missing.
    """
    if not under_torchelastic():
        return datetime.now()
    if int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1:
        return None
    return _process_start_time(os.getppid())


def launch_dir(root: str) -> str:
    """The Hydra run directory of this rank (see the module docstring)."""
    if env_rank() != 0:
        return "."
    start = launch_start_time()
    if start is None:
        # Nodes share the rendezvous id, and it survives restarts: torchrun's --rdzv-id.
        return f"{root}/torchrun-{os.environ['TORCHELASTIC_RUN_ID']}"
    return f"{root}/{start:%Y-%m-%d}/{start:%H-%M-%S}"


def rank_zero(on_rank_zero: Any, elsewhere: Any) -> Any:
    """One value on rank 0 and another on every other rank."""
    return on_rank_zero if env_rank() == 0 else elsewhere


def check_writable(run_dir: Path, *subdirs: str) -> None:
    """Fail before any work if the run directory (and these subdirectories of it) can't take
    our files."""
    for path in (run_dir, *(run_dir / d for d in subdirs)):
        try:
            path.mkdir(parents=True, exist_ok=True)
            probe = path / f".write-test-{os.getpid()}"
            probe.write_text("")
            probe.unlink()
        except OSError as e:
            raise PermissionError(f"run_dir {str(path)!r} is not writable: {e}") from e


def register_resolvers() -> None:
    """Make `${launch_dir:...}`, `${rank_zero:...}` and `${min:...}` available to the config
    files."""
    OmegaConf.register_new_resolver("launch_dir", launch_dir, replace=True)
    OmegaConf.register_new_resolver("rank_zero", rank_zero, replace=True)
    # ${min:a,b}: e.g. a record's validation sequence, capped by a smaller validation budget
    OmegaConf.register_new_resolver("min", min, replace=True)


def _process_start_time(pid: int) -> datetime | None:
    """A process's start time from /proc (Linux), to the second; None where unavailable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime ")
        )
    except (OSError, StopIteration, ValueError):
        return None
    # Field 22 (starttime, clock ticks after boot); fields after the ")" of the command name.
    ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"))


PREVIOUS_DIR = "previous"


def set_aside_previous(run_dir: Path, names: tuple[str, ...]) -> Path | None:
    """Move an earlier attempt's records (`names`: metrics, checkpoints) out of the way of a
    run that starts fresh in `run_dir`, into previous/<time>/; return where (None if none).

    A fresh start (train.resume=never, or a rerun with nothing to resume) would otherwise
    append a second step series to metrics.jsonl and leave old checkpoints beside the new
    ones. Moved, not deleted: nothing is lost, and `train.resume=<that dir>` still works.
    """
    found = [run_dir / n for n in names if _holds_something(run_dir / n)]
    if not found:
        return None
    target = run_dir / PREVIOUS_DIR / datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    target.mkdir(parents=True)
    for path in found:
        path.rename(target / path.name)
    return target


def _holds_something(path: Path) -> bool:
    """A non-empty file, or a directory with anything in it (check_writable may have just
    created an empty checkpoints/)."""
    if path.is_dir():
        return any(path.iterdir())
    return path.is_file() and path.stat().st_size > 0


# What a launch writes into its run directory before the run's first record: Hydra's saved
# config, the log file, and the (empty) checkpoint directory.
STARTUP_ENTRIES = frozenset({".hydra", "train.log", "checkpoints"})


def discard_unstarted(run_dir: Path, since: float) -> bool:
    """Remove `run_dir` if this launch made it (nothing in it older than `since`, a time.time())
    and it holds only STARTUP_ENTRIES with no checkpoint: a run that failed before it started
    leaves no directory behind. Returns whether it was removed."""
    import shutil

    if not run_dir.is_dir():
        return False
    entries = list(run_dir.iterdir())
    if not {p.name for p in entries} <= STARTUP_ENTRIES:
        return False
    checkpoints = run_dir / "checkpoints"
    if checkpoints.is_dir() and any(checkpoints.iterdir()):
        return False
    if any(p.stat().st_mtime < since for p in [run_dir, *entries]):
        return False  # an earlier run's directory, reused
    shutil.rmtree(run_dir, ignore_errors=True)
    return True
