"""SIGTERM and SIGINT become a request to checkpoint and stop, not a lost run.

Schedulers send SIGTERM before pre-empting a job (SLURM, Kubernetes, torchrun forwarding its
own); Ctrl-C sends SIGINT. Inside `StopRequests` the first of either only sets a flag; the
loop finishes the step, saves a checkpoint and stops. A second Ctrl-C interrupts at once.
"""

import logging
import signal
import threading
from types import FrameType, TracebackType

log = logging.getLogger("train")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequests:
    """A context that turns SIGTERM/SIGINT into `self.requested` (the signal's name)."""

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopRequests":
        # Handlers can only be installed from the main thread; elsewhere (a test calling
        # train() from a worker thread) the process keeps its default handling.
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: the user wants out now
        self.requested = name
        log.warning("%s received: finishing this step, then saving a checkpoint and stopping", name)


class Stopped(Exception):
    """The run stopped on a signal after saving a checkpoint; rerun to resume it."""

    def __init__(self, signal_name: str, step: int | None, checkpoint: str) -> None:
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        after = f" after step {step}" if step is not None else ""
        super().__init__(
            f"stopped by {signal_name}{after}; checkpoint saved to {checkpoint}. "
            "A run in the same run directory (train.resume=auto) continues from it."
        )

    @property
    def exit_code(self) -> int:
        """128 + the signal number: the shell's status for a process stopped by a signal,
        so a wrapper script can tell a stopped run from a finished one."""
        sig = getattr(signal.Signals, self.signal_name, signal.SIGTERM)
        return 128 + int(sig)
