"""Each record preset, resolved as `train.py experiment=...` composes it, holds the values
docs/records.md gives for its record: steps, batch and sequence lengths, every LR, betas, eps,
the momentum warmup, the window schedule's end, the LR floor, validation tokens and cadence.

The numbers below are copied from docs/records.md (record_2024_11_06 and record_2025_01_26), not
from the presets, and the schedules are checked through the functions a run calls, so a preset that
drifts from its record fails here.
"""

import math

import pytest

from optim.schedule import muon_momentum
from tests.helpers import compose_config
from trainer.config import to_config
from trainer.schedule import Schedule

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16


def resolved(name: str):
    return to_config(compose_config([f"experiment={name}", "run_dir=."]))


def test_record_2024_11_06_preset_is_records_md() -> None:
    """docs/records.md, record_2024_11_06 (2024-11-06, #9): A.1, A.3, A.4, A.5."""
    c = resolved("record_2024_11_06")
    m, t, mu, a, s = c.model, c.train, c.optim.muon, c.optim.adamw, c.optim.schedule
    assert (m.n_layer, m.n_head, m.n_embd, m.vocab_size) == (12, 6, 768, 50304)
    assert t.steps == 3200
    assert t.seq_len == 1024 and (t.val_seq_len or t.seq_len) == 1024
    assert t.batch_size * t.seq_len == 524_288 == 8 * 64 * 1024
    assert t.micro_batch_size == 64  # 64 rows x 1024 per GPU per forward
    assert (mu.lr, mu.momentum, mu.momentum_warmup_start) == (0.02, 0.95, 0.85)
    assert mu.momentum_warmup_steps == 500 and mu.momentum_form == "accumulate"
    assert mu.nesterov and mu.ns_steps == 5 and mu.ns_coefficients == "classic"
    assert mu.lr_scale == "original" and mu.weight_decay == 0.0
    assert (a.embed_lr, a.head_lr, a.scalar_lr) == (0.3, 0.002, 0.02)
    assert (a.beta1, a.beta2, a.eps, a.weight_decay) == (0.9, 0.95, 1e-8, 0.0)
    assert s.warmup_steps == 0 and s.min_lr_frac == 0.0 and m.attention.window_tokens == 0
    assert (t.val_tokens, t.val_every, t.untimed_steps) == (10_485_760, 125, 10)
    assert t.target_val_loss == 0  # every step runs, as in the record
    # A.4: constant 1 for s < 2286, then (3200 - s) / 914; momentum 0.85 -> 0.95 over 500.
    lr = [lr_at(c, step) for step in range(t.steps)]
    assert lr[2285] == 1.0 and lr[2286] == 1.0
    for step in (2287, 2500, 3000, 3199):
        assert lr[step] == pytest.approx((3200 - step) / 914, rel=1e-12)
    assert muon_momentum(0, 500, 0.85, 0.95) == 0.85
    assert momentum_at(c, 250) == pytest.approx(0.90) and momentum_at(c, 500) == 0.95
    assert (
        m.residual.x0_shortcut
        and m.attention.value_residual == "learned"
        and m.attention.value_residual_lambda == 0.5
    )
    assert (m.head.softcap, m.head.softcap_form, m.attention.rope, m.attention.rope_base) == (
        30.0,
        "tanh",
        "full",
        1e4,
    )


def test_record_2025_01_26_preset_is_records_md() -> None:
    """docs/records.md, record_2025_01_26 (2025-01-26, #21): B.1, B.3, B.4, B.5."""
    c = resolved("record_2025_01_26")
    m, t, mu, a, s = c.model, c.train, c.optim.muon, c.optim.adamw, c.optim.schedule
    assert (m.n_layer, m.n_head, m.n_embd, m.vocab_size, m.embed.rows) == (12, 6, 768, 50304, 50257)
    assert t.steps == 1770
    assert t.seq_len == 49_152 and t.val_seq_len == 262_144
    assert t.batch_size * t.seq_len == 393_216 == 8 * 49_152
    assert t.micro_batch_size == 1  # one packed sequence per GPU per forward
    assert (mu.lr, mu.momentum, mu.momentum_warmup_start) == (0.05, 0.95, 0.85)
    assert mu.momentum_warmup_steps == 300 and mu.momentum_form == "ema"
    assert mu.nesterov and mu.ns_steps == 5 and mu.ns_coefficients == "classic"
    assert mu.lr_scale == "original" and mu.weight_decay == 0.0
    assert (a.embed_lr, a.head_lr, a.scalar_lr) == (0.6, 0.008, 0.04)
    assert (a.beta1, a.beta2, a.eps, a.weight_decay) == (0.8, 0.95, 1e-10, 0.0)
    assert s.warmup_steps == 0 and s.min_lr_frac == 0.1
    assert (t.val_tokens, t.val_every, t.untimed_steps) == (10_485_760, 125, 10)
    assert t.target_val_loss == 0
    # B.4: f = 1 for s <= 1062, then 0.1 + 0.9 (1770 - s) / 708; last update ~0.1013.
    lr = [lr_at(c, step) for step in range(t.steps)]
    assert lr[1062] == 1.0 and lr[1063] < 1.0
    for step in (1063, 1400, 1769):
        assert lr[step] == pytest.approx(0.1 + 0.9 * (1770 - step) / 708, rel=1e-12)
    assert lr[1769] == pytest.approx(0.1013, abs=1e-4)
    assert momentum_at(c, 0) == 0.85 and momentum_at(c, 300) == 0.95
    # B.4's window table: N(s) = max(1, ceil(9 s / 1180)) blocks of 128, 14 at s = 1770.
    assert m.attention.window_block == 128
    first_steps = [0, 132, 263, 394, 525, 656, 787, 918, 1049, 1181, 1312, 1443, 1574, 1705]
    for n, first in enumerate(first_steps, start=1):
        assert window_blocks(c, first) == n
        if first:
            assert window_blocks(c, first - 1) == n - 1
    assert window_blocks(c, 1770) == 14  # the final validation's window
    assert (m.attention.scale, m.attention.rope, m.attention.merged_qkv) == (
        0.12, "half_truncated", True,
    ) and (m.numerics.dtype, m.head.fp8) == ("bf16", True)  # fmt: skip
    assert (m.head.softcap, m.head.softcap_form, m.attention.document_mask) == (
        30.0,
        "sigmoid",
        True,
    )
    assert m.attention.layers == "AAAAAAA.AAAA" and m.embed.value_embeds == "012......012"
    assert (
        m.attention.window == "LSSSLSSLSSSL"
        and m.residual.unet
        and m.residual.x0_shortcut
        and m.init_std == 0.5
    )


def schedule(c) -> Schedule:
    """The run's schedule, built from the resolved config as the trainer builds it."""
    return Schedule.for_run(c.train, c.optim, c.model)


def lr_at(c, step: int) -> float:
    return schedule(c).at(step).optim.lr_mult


def momentum_at(c, step: int) -> float:
    return schedule(c).at(step).optim.muon_momentum


def window_blocks(c, step: int) -> int:
    """N(s): the schedule's window in tokens, rounded up to whole blocks as the model does."""
    return math.ceil(schedule(c).model_args(step)["window_tokens"] / 128)
