"""trainer/observe/provenance.py: a run names its code (commit and dirty flag) in a git
checkout, and records nothing, without an error, outside one."""

import re
import subprocess
from pathlib import Path

import pytest

from trainer.observe import provenance


@pytest.fixture(autouse=True)
def _fresh() -> None:
    provenance.code_version.cache_clear()
    yield
    provenance.code_version.cache_clear()


def test_a_checkout_names_its_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "a.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "a.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    monkeypatch.setattr(provenance, "REPO", repo)
    assert provenance.code_version() == {"commit": head.strip(), "dirty": False}
    provenance.code_version.cache_clear()
    (repo / "a.py").write_text("x = 2\n")  # a tracked file changed
    assert provenance.code_version() == {"commit": head.strip(), "dirty": True}
    provenance.code_version.cache_clear()
    (repo / "b.py").write_text("")  # an untracked file is not the code that ran
    (repo / "a.py").write_text("x = 1\n")
    assert provenance.code_version()["dirty"] is False


def test_outside_a_checkout_there_is_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert provenance.code_version() is None
    monkeypatch.setattr(provenance, "REPO", Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all
    assert provenance.code_version() is None


def test_this_checkout() -> None:
    version = provenance.code_version()
    if version is not None:  # a clean clone (CI) or a working tree
        assert re.fullmatch(r"[0-9a-f]{40}", version["commit"]) and isinstance(
            version["dirty"], bool
        )
