"""`gpu_proof --render`: the committed tables in docs/gpu-proof.md are what the renderer makes
of the shipped JSON, it writes the page it names and nothing else, and a file that is not
there is one line of error, not a traceback."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench.gpu_proof import BEGIN, DOC, END, render

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "docs" / "gpu-proof" / "2026-11-26-h100.json"


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """The command as a clone runs it, from `cwd` (any file it writes there is seen)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "scripts.bench.gpu_proof", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_the_committed_tables_are_the_shipped_jsons(tmp_path: Path) -> None:
    page = tmp_path / "gpu-proof.md"
    shutil.copyfile(DOC, page)
    render(SHIPPED, page)
    assert page.read_text() == DOC.read_text()


def test_a_one_gpu_row_is_not_reported_as_eight() -> None:
    """The shipped row records no GPU count: the table claims none (it said 8), nor the
    per-kind medians that its measurement did not take."""
    from scripts.bench.proof_tables import tables

    text = DOC.read_text()
    table = text[text.index(BEGIN) : text.index(END)]
    assert "GPUs" not in table and "normal / Adam" not in table
    row = {"preset": "p", "window": "-", "tokens": 8, "warmup_s": 1.0, "step_ms": 2.0,
           "tokens_per_s": 4.0, "mfu": None, "graphs": 1, "graph_breaks": 0, "recompiles": 0,
           "record_ms": None}  # fmt: skip
    shared = {**row, "world": 8, "normal_ms": 1.5, "adam_ms": 5.0}
    md = tables({"parts": {"p": {"status": "ok", "seconds": 1.0, "rows": [row, shared]}}})
    assert "| as 1 GPU of | tokens/step/GPU | ms/step (period mean) | normal / Adam ms |" in md
    assert "| p | - | - | 8 | 2.0 | - / - |" in md and "| p | - | 8 | 8 | 2.0 | 1.5 / 5.0 |" in md


def test_the_command_writes_the_page_it_names_and_nothing_else(tmp_path: Path) -> None:
    page, before = tmp_path / "page.md", DOC.stat().st_mtime_ns
    shutil.copyfile(DOC, page)
    page.write_text(page.read_text().replace("| 147.8 |", "| 1.0 |"))
    done = cli(tmp_path, "--render", str(SHIPPED), "--doc", str(page))
    assert done.returncode == 0, done.stderr
    assert str(page) in done.stdout and BEGIN in done.stdout and END in done.stdout
    assert page.read_text() == DOC.read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["page.md"]  # no results/ or other file
    assert DOC.stat().st_mtime_ns == before


def test_check_compares_and_writes_nothing(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    shutil.copyfile(DOC, page)
    assert cli(tmp_path, "--render", str(SHIPPED), "--doc", str(page), "--check").returncode == 0
    stale = DOC.read_text().replace("| 147.8 |", "| 1.0 |")
    page.write_text(stale)
    done = cli(tmp_path, "--render", str(SHIPPED), "--doc", str(page), "--check")
    assert done.returncode == 1 and str(page) in done.stderr
    assert page.read_text() == stale


def test_a_missing_json_is_one_clear_line(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    shutil.copyfile(DOC, page)
    missing = tmp_path / "results" / "gpu_proof" / "gpu_proof.json"
    with pytest.raises(SystemExit, match=r"no file .*gpu_proof\.json.*2026-11-26-h100\.json"):
        render(missing, page)
    done = cli(tmp_path, "--render", "results/gpu_proof/gpu_proof.json", "--doc", str(page))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "results/gpu_proof/gpu_proof.json" in done.stderr
    assert "docs/gpu-proof/2026-11-26-h100.json" in done.stderr
    assert page.read_text() == DOC.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.md"]


def test_a_missing_page_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match=r"no page .*nowhere\.md.*--doc"):
        render(SHIPPED, tmp_path / "nowhere.md")
    assert not list(tmp_path.iterdir())
