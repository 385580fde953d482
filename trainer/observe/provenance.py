"""Which code a run ran: the git commit of this checkout and whether it had local changes.

Recorded in every checkpoint's metadata and in the first line of `metrics.jsonl`, so that a
curve or a checkpoint can be traced to the code that made it. Outside a git checkout (an
unpacked archive, git not installed) there is nothing to record, and that is not an error.
"""

import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@functools.cache
def code_version() -> dict[str, str | bool] | None:
    """{"commit": the HEAD commit's hash, "dirty": whether tracked files differ from it}, or
    None outside a git checkout. Asked once per process (a run's code does not change)."""
    try:
        commit = _git("rev-parse", "HEAD")
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _git(*args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return out.stdout.strip()
