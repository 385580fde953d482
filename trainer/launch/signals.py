"""SIGTERM and SIGINT become a request to stop at the next safe point, not a lost run.

Schedulers send SIGTERM before pre-empting a job (SLURM, Kubernetes, torchrun forwarding its
own); Ctrl-C sends SIGINT. Inside `StopRequests` the first of either only sets a flag; the
loop stops at the next safe point (between validation batches, or after the step in flight),
saves a checkpoint if anything changed since the last one, and raises `Stopped`. A second
Ctrl-C interrupts at once.

A Python signal handler runs only between two operations of the main thread, and one
operation (a kernel of a slow step) can take minutes. So the request is also announced from a
watcher thread, woken by the signal itself (`signal.set_wakeup_fd`): it says at once what the
run waits for (`StopRequests.doing`: "step 7 of 100, running for 42 s"). A second Ctrl-C that
the main thread cannot act on within `QUIT_GRACE_S` ends the process from that thread.

The handlers belong to the program that owns the process: `python train.py`, or a rank that
a launcher started (`claim_signals()` marks both). When `train()` runs inside another program
(a test runner, a notebook, a sweep driver) the process keeps that program's handling, so its
Ctrl-C still stops it; `StopRequests(force=True)` is for a test-only fault that sends the
process a real SIGTERM.
"""

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType, TracebackType

from trainer.run_dir import under_torchelastic

log = logging.getLogger("train")

SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Ctrl-C reaches every process of the terminal's group, and a launcher (torchrun, or
# dist.nproc) forwards its own copy to its ranks a moment later: a SIGINT this soon after the
# first is the same keypress, not a second one.
SAME_PRESS_S = 1.0
# A second Ctrl-C quits at once: if the main thread has not acted on it this long after it
# arrived (it is inside one long operation), the watcher thread ends the process.
QUIT_GRACE_S = 2.0

_claimed = False


def claim_signals() -> None:
    """Mark this process as the run's own (train.py's command line, a launched rank): runs
    in it turn SIGTERM/SIGINT into stop requests."""
    global _claimed
    _claimed = True


class StopRequests:
    """A context that turns SIGTERM/SIGINT into `self.requested` (the signal's name), in a
    process that owns its signals (see the module docstring). `announce`: log the request
    (one rank says it for all)."""

    def __init__(self, force: bool = False, announce: bool = True) -> None:
        self.requested: str | None = None
        self.force, self.announce = force, announce
        self._first_at = 0.0
        self._quitting = False  # the main thread took the second Ctrl-C
        self._previous: dict[int, object] = {}
        self._doing: tuple[str, str, float] | None = None
        self._watcher: _Watcher | None = None

    def doing(self, what: str | None, until: str = "the run stops when it ends") -> None:
        """What the run is busy with from now on ("step 7 of 100"; None: nothing long) and
        when a stop request takes effect, for the announcement of a stop request."""
        self._doing = (what, until, time.monotonic()) if what else None

    def __enter__(self) -> "StopRequests":
        owned = _claimed or under_torchelastic() or self.force
        # Handlers can only be installed from the main thread; elsewhere (a test calling
        # train() from a worker thread) the process keeps its default handling.
        if owned and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._watcher = _Watcher(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        if exc_type is not None and under_torchelastic():
            # A rank leaving on an error: torch's `record` now writes its error file while
            # torchrun, seeing a failed peer, SIGTERMs every rank. The default handler would
            # kill this one mid-write, and torchrun fails on the empty file. The process ends
            # here, so the flag-setting handlers stay.
            self._previous.clear()
            return
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        now = time.monotonic()
        if self.requested is not None:
            if signum == signal.SIGINT and now - self._first_at > SAME_PRESS_S:
                self._quitting = True
                raise KeyboardInterrupt  # a second Ctrl-C: the user wants out now
            return
        self.requested, self._first_at = name, now
        if self.announce and self._watcher is None:  # else the watcher has said it
            log.warning("%s", self.message(name))

    def message(self, name: str) -> str:
        """The announcement of a stop request by signal `name`: what it waits for."""
        doing = self._doing
        if doing is None:
            wait = "stopping at the next safe point"
        else:
            what, until, since = doing
            wait = f"{what} has been running for {time.monotonic() - since:.1f}s; {until}"
        return (
            f"{name} received: {wait} (a checkpoint is saved if anything changed since the "
            "last one). Ctrl-C again quits at once."
        )


class _Watcher:
    """A daemon thread woken by every signal (through `signal.set_wakeup_fd`) while the main
    thread may be inside one long operation: it announces the first stop request at once and
    carries out a second Ctrl-C that the main thread does not get to."""

    def __init__(self, stop: StopRequests) -> None:
        self.stop = stop
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._old_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._thread = threading.Thread(target=self._run, name="stop-requests", daemon=True)
        self._thread.start()

    def close(self) -> None:
        signal.set_wakeup_fd(self._old_fd)
        self._write.send(b"\0")  # not a signal number: the thread's cue to end
        self._thread.join(timeout=5)
        self._read.close()
        self._write.close()

    def _run(self) -> None:
        first_at: float | None = None
        while True:
            data = self._read.recv(64)
            if not data:
                return
            for signum in data:
                if signum == 0:
                    return
                if signum not in SIGNALS:
                    continue
                now = time.monotonic()
                if first_at is None:
                    first_at = now
                    if self.stop.announce:
                        log.warning("%s", self.stop.message(signal.Signals(signum).name))
                elif signum == signal.SIGINT and now - first_at > SAME_PRESS_S:
                    self._quit_unless_handled()

    def _quit_unless_handled(self) -> None:
        deadline = time.monotonic() + QUIT_GRACE_S
        while time.monotonic() < deadline:
            if self.stop._quitting:
                return
            time.sleep(0.05)
        log.warning("Ctrl-C again: quitting now, inside a running operation, without saving")
        logging.shutdown()
        os._exit(128 + signal.SIGINT)


class Stopped(Exception):
    """The run stopped on a signal, after saving a checkpoint if anything changed since the
    last one; rerun to resume it."""

    def __init__(
        self,
        signal_name: str,
        step: int | None,
        checkpoint: str | None,
        saved: bool = True,
        saves_none: bool = False,
    ) -> None:
        """`checkpoint`: the newest checkpoint (None: there is none); `saved`: whether this
        stop wrote it (False: nothing changed since it was written); `saves_none`: the run is
        configured to write no checkpoints at all."""
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        self.resumable = checkpoint is not None  # a rerun has something to continue from
        after = f" after step {step}" if step is not None else ""
        if checkpoint is None and saves_none:
            what = (
                "no checkpoint written (this run saves none: train.checkpoint_every=0 and "
                "train.checkpoint_at_end=false). Run it again to start over."
            )
        elif checkpoint is None:
            what = "no checkpoint written (no update happened). Run it again to start over."
        else:
            kept = "checkpoint saved to" if saved else "nothing changed since the checkpoint"
            what = (
                f"{kept} {checkpoint}. A run in the same run directory (train.resume=auto) "
                "continues from it."
            )
        super().__init__(f"stopped by {signal_name}{after}; {what}")

    @classmethod
    def by_ranks(cls, signal_name: str) -> "Stopped":
        """The launcher's view of ranks that stopped on a signal: each said what it saved."""
        stopped = cls(signal_name, None, None)
        stopped.args = (f"stopped by {signal_name} (the ranks said above what they saved).",)
        stopped.resumable = True  # as far as the launcher knows
        return stopped

    @property
    def exit_code(self) -> int:
        """128 + the signal number: the shell's status for a process stopped by a signal,
        so a wrapper script can tell a stopped run from a finished one."""
        sig = getattr(signal.Signals, self.signal_name, signal.SIGTERM)
        return 128 + int(sig)
