"""What a run says, where, and once: the run's own errors as one line from one process, and
notes for the log file alone (`to_log_file`).

The project's errors (`ONE_LINE`: a ValueError, OSError or FloatingPointError names the key or
file and the fix) print as one line under `python train.py`. Under a launcher every rank
usually meets the same error, and torch's `record` would print each rank's traceback and copy
it into the launcher's failure summary. Instead a rank leaving on one of them (`leave_rank`)
writes only its message into the error file the launcher reads (torchrun's summary then names
the error, with no traceback), and one process prints it: rank 0 under torchrun, the launching
process under `dist.nproc` (`RanksFailed`, from the file of the rank that failed first).

A rank that stops only because a peer failed (it waited in a collective for it) raises
`PeerFailed`. Launchers stop every rank once one has exited and name that one, so ranks leave
in an order (`_exit_delay`): rank 0, which prints, first; then other ranks with an error of
their own; ranks that stopped for a peer last.

Imports no torch: the command line uses it before the config is valid.
"""

import json
import logging
import os
import signal
import sys
import time
from typing import Any, NoReturn

from trainer.run_dir import env_rank

# How long a rank other than 0 waits before it exits on its own error (twice as long on a
# peer's): the launcher ends it sooner, once the rank before it has exited.
EXIT_DELAY_S = 2.0
# The key of a rank's error file that holds the one line (torch's own keys hold tracebacks).
LINE_KEY = "oneLine"


class PeerFailed(RuntimeError):
    """This rank stops because another rank failed; that rank's error says why."""


class RanksFailed(Exception):
    """Raised by the process that started the ranks (`dist.nproc`): a rank stopped on one of
    the project's errors, whose message this is."""


ONE_LINE = (ValueError, OSError, FloatingPointError, PeerFailed, RanksFailed)


def leave_rank(e: BaseException, line: str | None = None) -> NoReturn:
    """End this launched rank on `e` (one of ONE_LINE) with exit status 1: write `e` into the
    launcher's error file, print `line` on stderr if given, and exit in turn (`_exit_delay`).
    """
    # Once one rank has exited the launcher SIGTERMs the rest: this one first says why it
    # stops, noting the request.
    stop_requested: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(signum))
    _write_error_file(e)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    if delay := _exit_delay(e):
        for sig in (signal.SIGTERM, signal.SIGINT):  # all said: the launcher may end it quietly
            signal.signal(sig, signal.SIG_DFL)
        if not stop_requested:
            time.sleep(delay)
    sys.exit(1)


def _exit_delay(e: BaseException) -> float:
    if isinstance(e, PeerFailed):
        return 2 * EXIT_DELAY_S
    return 0.0 if env_rank() == 0 else EXIT_DELAY_S


def reported_line(failed: Any) -> str | None:
    """The one line that the first failed rank of `failed` (torch's ChildFailedError) left in
    its error file, or None if it left none (a crash, a traceback)."""
    _, failure = failed.get_first_failure()
    data = failure.error_file_data
    return data.get(LINE_KEY) if isinstance(data, dict) else None


def _write_error_file(e: BaseException) -> None:
    """`e` as torch's `record` would write it (so the launcher's summary shows it), with the
    message alone in place of the traceback."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    text = f"{type(e).__name__}: {e}"
    # The launcher names the rank whose file has the earliest timestamp (whole seconds) as
    # the root cause. A rank stopping for a peer may write before the peer that failed (on a
    # loaded machine, between the failure's broadcast and its own file): its time is the
    # time it leaves, after its exit delay, so the failing rank's file always comes first.
    when = time.time() + _exit_delay(e) if isinstance(e, PeerFailed) else time.time()
    data = {
        "message": {"message": text, "extraInfo": {"timestamp": str(int(when))}},
        LINE_KEY: str(e),
    }
    # Whole or not at all: the launcher fails on a half-written file.
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def to_log_file(level: int, message: str) -> None:
    """Write `message` to the run's log file (rank 0's train.log) but not to the console."""
    log = logging.getLogger("train")
    record = log.makeRecord(log.name, level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
