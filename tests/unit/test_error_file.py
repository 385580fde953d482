"""A rank's error file for the launcher (trainer/launch/report.py): the launcher names the file
with the earliest timestamp as the root cause, so a rank that stops for a peer dates its file
at the time it leaves, after the failing rank's."""

import json
import time
from pathlib import Path

import pytest

from trainer.launch.report import EXIT_DELAY_S, LINE_KEY, PeerFailed, _write_error_file


def written(e: BaseException, path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    _write_error_file(e)
    return json.loads(path.read_text())


def test_a_peers_file_is_dated_after_the_failing_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = time.time()
    peer = written(PeerFailed("rank 0 failed"), tmp_path / "1.json", monkeypatch)
    own = written(ValueError("data.dir=x is not a directory"), tmp_path / "0.json", monkeypatch)
    stamp = {
        k: int(d["message"]["extraInfo"]["timestamp"]) for k, d in (("peer", peer), ("own", own))
    }
    assert stamp["own"] <= int(now) + 1  # the failing rank's own time
    assert stamp["peer"] > stamp["own"]  # written first, dated after: never the root cause
    assert stamp["peer"] >= int(now + 2 * EXIT_DELAY_S)
    assert own[LINE_KEY] == "data.dir=x is not a directory"
    assert not list(tmp_path.glob("*.tmp")), "written whole, through a temporary file"
