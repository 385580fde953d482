"""README.md's short commands run as printed: the smoke run, and every script it names takes
the flags README gives it (each script's own --help lists them). The record toy command runs
in tests/e2e/test_records.py; every train.py command's config is checked in
tests/unit/test_readme.py."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_readme import readme_commands, readme_scripts

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_smoke_command_runs_as_printed(tmp_path: Path, corpus_cache: Path) -> None:
    assert ["python", "train.py", "experiment=smoke"] in readme_commands()
    cmd = [
        sys.executable,
        "train.py",
        "experiment=smoke",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"data.cache_dir={corpus_cache}",
    ]  # fmt: skip  (the test's shared corpus cache)
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=280, env=_env())
    assert out.returncode == 0, out.stderr[-3000:]
    assert "done: 20 steps" in out.stdout + out.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_every_script_takes_the_flags_the_readme_gives_it() -> None:
    scripts = readme_scripts()
    procs = {}
    for script in scripts:
        head = ["-m", script] if not script.endswith(".py") else [script]
        procs[script] = subprocess.Popen(
            [sys.executable, *head, "--help"], cwd=REPO, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=_env(),
        )  # fmt: skip
    for script, proc in procs.items():
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, f"{script} --help:\n{out[-2000:]}"
        missing = [flag for flag in sorted(scripts[script]) if flag not in out]
        assert not missing, f"README.md gives {script} {missing}, which its --help lacks"
