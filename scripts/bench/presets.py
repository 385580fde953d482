"""The presets the GPU benchmarks build (scripts/bench/gpu.py, optim_step.py, the GPU proof and
dry run), what they are built from (`PARTS`, train.py's) and the records' own per-GPU step
times. Their sizes are the presets' own (conf/size/):
`--toy` is each preset's CPU toy, the dry run's default its GPU toy."""

from pathlib import Path

from data.build import build_data
from model import GPT
from optim import build_optimizer
from stages import stage_index
from trainer.build import Parts
from trainer.cli.overrides import compose_config
from trainer.config import Config, to_config

CONF = Path(__file__).resolve().parents[2] / "conf"
PARTS = Parts(model=GPT, optimizer=build_optimizer, data=build_data)  # train.py's
GPUS = 8  # the records' world: each GPU runs batch_size / 8 sequences per step
# The records' own ms per step on one of their 8 GPUs; by batch phase for the 2025-11 record, by
# stage for the others (record_medium_2025_12_31's twelve: its four batch sizes, the last over
# 1,175-4,699)
RECORD_STEP_MS = {
    "record_2024_11_06": 154.78, "record_2025_01_26": 100.0,
    "record_2025_11_29": (33.9, 60.1, 88.1), "record_2026_07_17": (31.50, 56.82, 82.78),
    "record_medium_2025_12_31": (72.15, 129.18, 189.10, *[249.10] * 9),
}  # fmt: skip
# The presets, each an experiment (conf/experiment/); `dense_124m` is GPT-2 small as it comes
PRESETS = ("record_2024_11_06", "record_2025_01_26", "record_2025_11_29", "record_2026_07_17",
           "record_medium_2025_12_31", "dense_124m")  # fmt: skip
# On a CPU: trace (graph breaks and recompiles are counted) without inductor's kernel builds.
# Masks stay dense (attention_impl auto = sdpa here): FlexAttention has no backward on a CPU.
# The optimizer stays eager: its compile is tests/unit/test_optimizer_compile.py's business.
TOY_CPU = ["model.compile=true", "model.compile_backend=eager", "optim.compile=false"]


# The benchmarks' toy: the preset's CPU toy (`size=toy`) as one GPU's share of an 8-GPU step,
# one sequence a GPU
BENCH_TOY = [f"train.batch_size={GPUS}", "train.micro_batch_size=1"]


def record_step_ms(name: str, conf: Config, step: int) -> float | None:
    """The record `name`'s own per-GPU ms at `step` (its stage's where it gives one per
    stage); None for a preset that is no record."""
    ms = RECORD_STEP_MS.get(name)
    if isinstance(ms, tuple):
        return ms[stage_index(step, conf.train.scheduled_steps, len(ms))]
    return ms


def compose(name: str, device: str, size: str, sets: list[str]) -> Config:
    """The preset's config at `size` (conf/size/: full, toy or gpu_toy), then `--set`'s
    overrides. At toy size one sequence a GPU; on a CPU, below full size, traced only."""
    overrides = [f"experiment={name}", "run_dir=.", f"train.device={device}", f"size={size}"]
    overrides += BENCH_TOY if size == "toy" else []
    overrides += TOY_CPU if device == "cpu" and size != "full" else []
    return hydra_config([*overrides, *sets])


def hydra_config(overrides: list[str]) -> Config:
    return to_config(compose_config(overrides, CONF))
