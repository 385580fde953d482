"""The GPU proof's plumbing at toy size on a CPU: every part runs in its own process under its
cap, the JSON and the tables are written, a part past its cap is skipped with a note while the
others go on, and `--render` puts the tables into a page between its markers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench.gpu_proof import BEGIN, CAPS, END, render
from scripts.bench.proof_parts import real_run

REPO = Path(__file__).resolve().parents[2]


def proof(tmp_path: Path, cache: Path, *args: str) -> tuple[dict, str, str]:
    out = tmp_path / "proof"
    cmd = [sys.executable, "-m", "scripts.bench.gpu_proof", "--toy", "--device", "cpu",
           "--out", str(out), "--data-dir", str(cache), *args]  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "gpu_proof.json").read_text())
    return results, (out / "gpu_proof.md").read_text(), (out / "gpu_proof.log").read_text()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_every_part_runs_at_toy_size_and_writes_its_tables(
    tmp_path: Path, corpus_cache: Path
) -> None:
    # Every part but records #9, #21, #46 and M and the dense model, which run the same preset
    # part as #89 (CI's time; each preset trains in its own tests)
    shared = ("record_2024_11_06", "record_2025_01_26", "record_2025_11_29",
              "record_medium_2025_12_31", "dense_124m")  # fmt: skip
    names = [n for n in CAPS if n not in shared]
    results, md, log = proof(tmp_path, corpus_cache, *names)
    parts = results["parts"]
    assert list(parts) == names
    failed = {k: p["note"] for k, p in parts.items() if p["status"] != "ok"}
    assert not failed, f"{failed}\n{log[-4000:]}"
    assert parts["env"]["env"]["device"] == "cpu" and parts["env"]["env"]["torch"]
    for r in parts["record_2026_07_17"]["rows"]:
        assert r["step_ms"] > 0 and r["graph_breaks"] == 0 and r["recompiles"] == 0, r
    assert len(parts["record_2026_07_17"]["rows"]) == 3  # the three stages
    assert [r["run"] for r in parts["strategies"]["rows"]] == ["ddp", "fsdp", "ddp + offload"]
    run = parts["real_run"]["rows"][0]
    assert run["ok"] and run["passes"] == 1 and run["first_wrap"] is None, run
    assert "Toy size on a CPU" in md and "| record_2026_07_17 |" in md
    assert "| fsdp |" in md and "| learns: held-out loss fell" in md
    assert md.count("| ok |") == len(names)

    page = tmp_path / "gpu-proof.md"
    page.write_text(f"# x\n\nbefore\n{BEGIN}\nold table\n{END}\nafter\n")
    render(tmp_path / "proof" / "gpu_proof.json", page)
    text = page.read_text()
    assert "old table" not in text and md.strip() in text
    assert text.startswith("# x\n\nbefore\n") and text.endswith(f"{END}\nafter\n")


@pytest.mark.slow
def test_the_real_runs_check_fails_a_run_that_memorises(corpus_cache: Path) -> None:
    """The same toy on pieces of at most 8 tokens: the 96 training documents serve 3 steps,
    then repeat. The training loss falls far below the held-out loss, and the check, which
    the toy on its own pieces passes (above), fails."""
    pieces = ("data.max_piece_len=8", "train.stages.columns.max_piece_len=[8,8,8]")
    row = real_run("cpu", True, corpus_cache, pieces)["rows"][0]
    assert (row["passes"], row["first_wrap"]) == (6, 4)
    assert row["finite"] and not row["ok"] and row["gap"] > row["gap_allowed"], row


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_part_past_its_cap_is_skipped_and_the_rest_go_on(
    tmp_path: Path, corpus_cache: Path
) -> None:
    results, md, _ = proof(tmp_path, corpus_cache, "head", "env", "--cap", "head=0.5")
    parts = results["parts"]
    assert parts["head"]["status"] == "skipped" and "cap of 0.5s" in parts["head"]["note"]
    assert parts["env"]["status"] == "ok"
    assert "| head | skipped |" in md


def test_render_refuses_a_page_without_markers(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(json.dumps({"parts": {}}))
    (tmp_path / "gpu-proof.md").write_text("no markers\n")
    with pytest.raises(SystemExit, match="gpu-proof:begin"):
        render(tmp_path / "r.json", tmp_path / "gpu-proof.md")


def test_set_reaches_the_preset_parts_and_the_tables() -> None:
    """--set's overrides are composed into each preset part's config (a key that does not
    exist is refused there, by name) and named above the tables."""
    from scripts.bench.proof_parts import preset
    from scripts.bench.proof_tables import tables

    with pytest.raises(Exception, match=r"model\.no_such_key"):
        preset("record_2024_11_06", "cpu", True, sets=("model.no_such_key=1",))
    sets = ["model.mlp.fp8_kernel=triton", "model.head.loss_kernel=triton"]
    done = {"status": "ok", "seconds": 1.0, "rows": []}
    md = tables({"parts": {"record_2026_07_17": {**done, "sets": sets}}})
    assert "Preset overrides (--set): `model.head.loss_kernel=triton`, `model.mlp" in md
    assert "Preset overrides" not in tables({"parts": {"record_2026_07_17": done}})
    failed = {"status": "failed", "seconds": 1.0, "note": "exit 1"}  # no rows: named all the same
    md = tables({"sets": sets, "parts": {"record_2026_07_17": failed}})
    assert "Preset overrides (--set): `model.head.loss_kernel=triton`" in md


def test_the_kernels_command_keeps_its_order_and_budget(tmp_path: Path) -> None:
    """scripts/bench/kernels_gpu.sh (the kernels' GPU command): with no budget left it runs
    no step and says so for each, in its order; where varlen_attn cannot run (here: a CPU)
    the varlen key is left out, with the reason."""
    import os

    out = tmp_path / "k"
    env = {**os.environ, "BUDGET": "0", "PYTHON": sys.executable}
    script = REPO / "scripts" / "bench" / "kernels_gpu.sh"
    done = subprocess.run(["bash", str(script), str(out)], env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = (out / "SUMMARY.md").read_text()
    assert summary.startswith("varlen attention left out: no CUDA device\n")
    steps = ["cold", "attention_stage1", "attention_stage3", "loss_kernel", "mlp_kernel", "warm"]
    assert [line.split(":")[0][3:] for line in summary.splitlines()[1:]] == steps
    assert summary.count("not run, the budget was spent") == len(steps)
