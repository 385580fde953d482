"""Shared test helpers: compose the real Hydra config with small CPU overrides; hand a model
config a stage table."""

import signal
import subprocess
import time
from pathlib import Path

from omegaconf import DictConfig

from stages import Stage, StageTable
from trainer.cli.overrides import compose_config as compose_run_config

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

# Record #89's preset at toy size (`size=toy`) for a model built in the test process: document
# pieces, token windows long and short, paired layers, YaRN, key offset, XSA, the FP8 head and
# MLP (its 11 layers at d 48, windows of 16-token blocks).
RECORD_89_TOY = ["experiment=record_2026_07_17", "size=toy", "run_dir=."]
# A run that finishes in seconds on a 2-core CPU: 2 layers, d 64, 2 x 64 tokens per step.
TINY = [
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=64",
    "train.steps=4",
    "train.batch_size=2",
    "train.seq_len=64",
    "train.val_every=2",
    "train.val_tokens=512",
    "train.device=cpu",
    "train.autocast=none",
    "train.checkpoint_every=0",  # tests that checkpoint say so (each save is ~80 MB here)
    "train.checkpoint_at_end=false",
]


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose `conf/config.yaml` exactly as `python train.py <overrides>` would."""
    return compose_run_config(list(overrides or []), CONF_DIR)


def stage_table(windows: list[int], **table: object) -> StageTable:
    """A stage table (the run's train.stages, which the model is handed when built) of these
    long windows by stage and the table's entries `table` (window_after=13, ...)."""
    return StageTable(rows=[Stage(window=w) for w in windows], **table)


def sigterm_after(cmd: list[str], cwd: Path, run_dir: Path | None, records: int) -> tuple[int, str]:
    """Start `cmd`, SIGTERM it once `run_dir/metrics.jsonl` holds `records` lines; return its
    exit status and output. `run_dir=None`: the run chooses its directory at launch, so wait
    for the first metrics file anywhere under `cwd`."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 200
        while not _holds(run_dir, cwd, records):
            assert proc.poll() is None and time.monotonic() < deadline, "run never got going"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        proc.kill()
    return proc.returncode, out


def _holds(run_dir: Path | None, cwd: Path, records: int) -> bool:
    found = [run_dir / "metrics.jsonl"] if run_dir else list(cwd.rglob("metrics.jsonl"))
    return any(f.exists() and len(f.read_text().splitlines()) >= records for f in found)


def dotted(node: dict, prefix: str = "") -> dict:
    """A nested dict (a preset file's) as {dotted key: value}, as `model.config.update`
    takes its changes."""
    out = {}
    for key, value in node.items():
        out |= (
            dotted(value, f"{prefix}{key}.") if isinstance(value, dict) else {prefix + key: value}
        )
    return out
