"""Stop requests: the first SIGTERM/SIGINT only asks; the launcher's forwarded copy of the
same Ctrl-C is not a second press; a second press quits; handlers go back afterwards, and a
process that does not own its signals keeps its own handling."""

import os
import signal
import time

import pytest

import trainer.launch.signals as signals
from trainer.launch.signals import Stopped, StopRequests


def _own(monkeypatch: pytest.MonkeyPatch, owned: bool) -> None:
    monkeypatch.setattr(signals, "_claimed", owned)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)


def test_a_process_that_does_not_own_its_signals_keeps_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _own(monkeypatch, False)
    # The caller's own handler, Python's default: whatever an earlier test in this worker
    # left installed is not what this test is about.
    earlier = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with StopRequests():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
            with pytest.raises(KeyboardInterrupt):  # the caller's Ctrl-C, as without a run
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)
    finally:
        signal.signal(signal.SIGINT, earlier)


def test_first_press_asks_the_launchers_copy_is_the_same_press_a_second_quits(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _own(monkeypatch, True)
    before = signal.getsignal(signal.SIGINT)
    with StopRequests() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested == "SIGINT"
        os.kill(os.getpid(), signal.SIGINT)  # within SAME_PRESS_S: a launcher's forward
        assert stop.requested == "SIGINT"
        monkeypatch.setattr(signals, "SAME_PRESS_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    assert signal.getsignal(signal.SIGINT) is before
    assert sum("Ctrl-C again quits at once" in r.message for r in caplog.records) == 1


def test_sigterm_asks_and_a_quiet_rank_says_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _own(monkeypatch, False)
    with StopRequests(force=True, announce=False) as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
    assert stop.requested == "SIGTERM" and not caplog.records


def test_the_stop_message_says_what_was_kept() -> None:
    assert "checkpoint saved to ck/step_5" in str(Stopped("SIGINT", 5, "ck/step_5"))
    assert "nothing changed since the checkpoint ck/step_5" in str(
        Stopped("SIGINT", 5, "ck/step_5", saved=False)
    )
    fresh = Stopped("SIGINT", None, None)
    assert "no checkpoint written" in str(fresh) and fresh.exit_code == 130
    assert "the ranks said" in str(Stopped.by_ranks("SIGTERM"))


def test_the_announcement_names_what_runs_and_for_how_long(monkeypatch) -> None:
    stop = StopRequests()
    assert "stopping at the next safe point" in stop.message("SIGTERM")
    clock = iter([100.0, 142.5])
    monkeypatch.setattr(signals.time, "monotonic", lambda: next(clock))
    stop.doing("step 7 of 100")
    said = stop.message("SIGTERM")
    assert said.startswith("SIGTERM received: step 7 of 100 has been running for 42.5s; the run")
    stop.doing(None)
    assert "next safe point" in stop.message("SIGINT")


HELD = """
import os, signal, sys, time
sys.path.insert(0, {repo!r})
import trainer.launch.signals as s
from trainer.launch.fault import _hold
s.claim_signals()
with s.StopRequests() as stop:
    stop.doing("step 1 of 2")
    print("holding", flush=True)
    _hold(30)  # one long operation: no Python handler runs in it
print("the hold ended", flush=True)
"""


def test_a_second_ctrl_c_quits_from_inside_a_long_operation(tmp_path) -> None:
    """The main thread is held for 30 s: the first Ctrl-C is announced at once and a second
    (after SAME_PRESS_S) ends the process QUIT_GRACE_S later, not when the hold ends."""
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    script = tmp_path / "held.py"
    script.write_text(HELD.format(repo=repo))
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert proc.stdout.readline().strip() == "holding"
    proc.send_signal(signal.SIGINT)
    time.sleep(signals.SAME_PRESS_S + 0.5)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=20)[0]
    took = time.monotonic() - sent
    assert proc.returncode == 128 + signal.SIGINT, out
    assert took < signals.QUIT_GRACE_S + 3, took
    assert "SIGINT received: step 1 of 2 has been running for" in out, out
    assert "quitting now" in out and "the hold ended" not in out, out


def test_a_rank_leaving_on_an_error_keeps_its_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun an error exit keeps the flag-setting handlers (a SIGTERM from torchrun
    must not kill the rank while torch writes its error file); a normal exit puts the
    previous ones back."""
    _own(monkeypatch, False)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    before, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        with StopRequests() as stop:
            pass
        assert signal.getsignal(signal.SIGTERM) is before
        with pytest.raises(RuntimeError), StopRequests() as stop:
            raise RuntimeError("a peer died")
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        os.kill(os.getpid(), signal.SIGTERM)  # only asks
        assert stop.requested == "SIGTERM"
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_int)
