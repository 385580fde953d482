"""The presets the GPU benchmarks build (scripts/bench/gpu.py, optim_step.py, the GPU proof and
dry run), their toy sizes, and the records' own per-GPU step times."""

from pathlib import Path

from trainer.config import Config, register_configs, to_config

CONF = Path(__file__).resolve().parents[2] / "conf"
GPUS = 8  # the records' world: each GPU runs batch_size / 8 sequences per step
# The records' own ms per step on one of their 8 GPUs; by batch phase for the 2025-11 record,
# by stage for the others (record M's twelve: its four batch sizes, the last over 1,175-4,699)
RECORD_STEP_MS = {
    "record_2024_11_06": 154.78, "record_2025_01_26": 100.0,
    "record_2025_11_29": (33.9, 60.1, 88.1), "record_2026_07_17": (31.50, 56.82, 82.78),
    "record_medium_2025_12_31": (72.15, 129.18, 189.10, *[249.10] * 9),
}  # fmt: skip
PRESETS = {
    "record_2024_11_06": ["experiment=record_2024_11_06"],
    "record_2025_01_26": ["experiment=record_2025_01_26"],
    "record_2025_11_29": ["experiment=record_2025_11_29"],
    "record_2026_07_17": ["experiment=record_2026_07_17"],
    "record_medium_2025_12_31": ["experiment=record_medium_2025_12_31"],
    "dense_124m": [  # GPT-2 small as it comes, compiled, 64 x 1024 tokens per GPU
        "model=gpt2_124m", "model.compile=true", "train.autocast=bf16", "train.seq_len=1024",
        f"train.batch_size={64 * GPUS}", "train.micro_batch_size=64",
    ],
}  # fmt: skip
TOY = [  # 3 layers (long, short, long windows in the 2025-01 layout), 16 blocks of 16 tokens
    "model.n_layer=3", "model.n_embd=64", "model.n_head=1", "model.attention.window_block=16",
    "train.seq_len=256", f"train.batch_size={GPUS}", "train.micro_batch_size=1",
    "train.val_seq_len=512",
]  # fmt: skip
TOY_WINDOW = "model.attention.window_tokens=192"  # 1 -> 12 of the 16 blocks, where windows grow
# The 2025-11 record at 4 layers (record layers 0, 4, 7, 11: skip 4 -> 7 is 1 -> 2, the backout
# of record layer 8 the nearest, 7) and its three sequence lengths at toy size
TOY_EXTRA = {
    "record_2025_11_29": [
        "model.n_layer=4", "model.n_head=2", "model.residual.skips=[[1,2]]",
        "model.residual.backout_layer=2", "train.stages.rows.0.seq_len=64",
        "train.stages.rows.1.seq_len=128", "train.stages.rows.2.seq_len=256",
    ],
    # The 2026-07 record with its own 11-layer table, 6 heads of 8 (paired heads need 6).
    "record_2026_07_17": [
        "model.n_layer=11", "model.n_head=6", "model.n_embd=48", "model.bigram.rows=256",
        "model.bigram.dim=8", "model.residual.mudd_hidden=8",
        "train.stages.rows.0={seq_len:64,max_piece_len:32}",
        "train.stages.rows.1={seq_len:128,max_piece_len:128}",
        "train.stages.rows.2={seq_len:256,max_piece_len:128}", "data.max_piece_len=128",
        "optim.tie_embed_head_until=5",
    ],
    # Record M with its own 16-layer table, 4 heads of 16; its twelve stages 64 … 256 tokens.
    "record_medium_2025_12_31": [
        "model.n_layer=16", "model.n_head=4",
        *(f"train.stages.rows.{i}.seq_len={64 * min(i + 1, 4)}" for i in range(12)),
        "optim.tie_embed_head_until=5",
    ],
}  # fmt: skip
# On a CPU: trace (graph breaks and recompiles are counted) without inductor's kernel builds.
# Masks stay dense (attention_impl auto = sdpa here): FlexAttention has no backward on a CPU.
# The optimizer stays eager: its compile is tests/unit/test_optimizer_compile.py's business.
TOY_CPU = ["model.compile=true", "model.compile_backend=eager", "optim.compile=false"]


def compose(name: str, device: str, toy: bool, sets: list[str]) -> Config:
    """The preset's config: its overrides, then the toy's, then `--set`'s."""
    overrides = [*PRESETS.get(name, [f"experiment={name}"]), "run_dir=.", f"train.device={device}"]
    if toy:
        overrides += [*TOY, *(TOY_CPU if device == "cpu" else []), *TOY_EXTRA.get(name, [])]
        model = hydra_config([*overrides, *sets]).model
        if model.attention.window and not model.attention.long_windows:
            overrides.append(TOY_WINDOW)
    return hydra_config([*overrides, *sets])


def hydra_config(overrides: list[str]) -> Config:
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=overrides))
