"""The command a stopped run prints to continue it names the interpreter the user's shell
must call: `python` where that is the one that ran (an active virtualenv), else its path, as
for `make train`, which runs .venv's python without activating the virtualenv."""

import sys
from pathlib import Path

import pytest

from trainer.cli import main


def test_python_on_path_is_named_python(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main.shutil, "which", lambda name: sys.executable)
    assert main.python_command() == "python"


def test_an_unactivated_virtualenv_is_named_by_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    venv_python = tmp_path / ".venv" / "bin" / "python"
    monkeypatch.setattr(main.sys, "executable", str(venv_python))
    monkeypatch.setattr(main.shutil, "which", lambda name: "/usr/bin/python")  # the system's
    monkeypatch.chdir(tmp_path)
    assert main.python_command() == ".venv/bin/python"  # relative to where the user stands
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main.python_command() == str(venv_python)
    monkeypatch.setattr(main.shutil, "which", lambda name: None)  # no `python` at all
    assert main.python_command() == str(venv_python)


def test_continue_command_pins_the_run_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main.shutil, "which", lambda name: sys.executable)
    monkeypatch.setattr(main.sys, "argv", ["train.py", "seed=3", "hydra.run.dir=old"])
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert main.continue_command("outputs/first") == (
        "python train.py seed=3 hydra.run.dir=outputs/first"
    )
