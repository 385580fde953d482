"""The 2025-11 record's schedules (docs/records.md, record_2025_11_29 (C.4)): LR peaks by their own
edges, the Muon momentum cooldown, the sequence length and the windows by stage, the extension
steps and the YaRN table, through the objects a run calls (`Schedule.for_run`, `yarn_table`).

The expected numbers are C.4's table, copied to its printed digits, and a reference written
from C.4's formulas below (no project module inside it). With the new keys at their defaults,
record_2025_01_26's preset must give today's values at every step, bit for bit.
"""

import pytest
import torch
from omegaconf import OmegaConf

from model.config import ModelConfig
from model.rotary import Rotary
from model.window_schedule import window_at
from model.yarn import yarn_table
from optim.config import MuonConfig
from optim.schedule import lr_multiplier, muon_momentum, optim_values
from stages import StageTable, stage_index
from tests.helpers import compose_config
from trainer.config import Config, TrainConfig, to_config
from trainer.schedule import Schedule

STEPS, SCHEDULED = 2160, 2120  # C.4: 2,120 scheduled + 40 extension steps

# record_2025_11_29's settings as a run's config would hold them (the keys this file tests).
ATTENTION = {"window": "LSSSLSSLSSSL", "window_block": 128, "yarn": True, "scale": 0.1,
             "rope": "half_truncated"}  # fmt: skip
# Its stage table: three equal stages of the 2,120 scheduled steps, the peaks by their own edges
ROWS = {"seq_len": [16384, 32768, 49152], "window": [3, 7, 11], "lr_peak": [1.0, 1.51, 1.93]}


def rows(**changes: list) -> list[dict]:
    """record_2025_11_29's rows with `changes` ({column: a value per row}) in place of its
    columns."""
    columns = ROWS | changes
    per_row = zip(*columns.values(), strict=True)
    return [dict(zip(columns, values, strict=True)) for values in per_row]


RECORD_2025_11_29 = {
    "model": {"attention": ATTENTION},
    "optim": {
        "muon": {"lr": 0.023, "momentum": 0.95, "momentum_warmup_start": 0.85,
                 "momentum_warmup_steps": 300, "momentum_cooldown_steps": 50,
                 "momentum_cooldown_end": 0.85},
        "schedule": {"warmup_steps": 0, "cooldown_frac": 0.55, "min_lr_frac": 0.1,
                     "cooldown_form": "fraction"},
    },
    "train": {
        "steps": STEPS, "extension_steps": 40, "batch_size": 8, "seq_len": 49152,
        "stages": {"rows": rows(), "window_after": 13, "window_final_eval": 20,
                   "peak_edges": [0.33, 0.66]},
        "val_seq_len": 262144,
    },
    "data": {"val_tokens": 10_485_760},
}  # fmt: skip


def stages(**changes: object) -> dict:
    """The changes that set record_2025_11_29's stage-table entries `changes`."""
    return {"train": {"stages": changes}}


def record_2025_11_29(**changes: dict) -> Config:
    """record_2025_11_29's config, validated, with `changes` ({group: {key: value}}) merged in."""
    return to_config(OmegaConf.to_container(OmegaConf.merge(RECORD_2025_11_29, changes)))


@pytest.fixture(scope="module")
def run() -> tuple[Config, Schedule, list[float]]:
    c = record_2025_11_29()
    head_dim = c.model.n_embd // c.model.n_head
    freqs = Rotary(head_dim, mode="half_truncated").inv_freq
    scales = yarn_table(
        freqs, c.train.stages.long_windows, 128, c.model.attention.scale
    ).attn_scales
    return c, Schedule.for_run(c.train, c.optim, c.model), scales


# --- the reference, from C.4's formulas ------------------------------------------------------


def ref_peak(s: int) -> float:
    x = s / 2120
    return 1.0 if x <= 0.33 else 1.51 if x <= 0.66 else 1.93


def ref_lr(s: int) -> float:
    if s > 2120:
        return 0.1
    if s / 2120 < 0.45:
        return ref_peak(s)
    return 0.1 + (ref_peak(s) - 0.1) * (2120 - s) / 1166


def ref_momentum(s: int) -> float:
    if s < 300:
        return 0.85 + 0.1 * s / 300
    if s <= 2110:
        return 0.95
    return 0.95 - 0.1 * (s - 2110) / 50


def ref_tokens(s: int) -> int:
    return 131_072 if s <= 706 else 262_144 if s <= 1413 else 393_216


def ref_long(s: int) -> int:
    return 3 if s <= 706 else 7 if s <= 1413 else 11 if s < 2120 else 13


def ref_stage(s: int) -> int:
    """The number of window changes (707: 3→7, 1414: 7→11, 2120: 11→13) at or before s."""
    return sum(s >= change for change in (707, 1414, 2120))


# --- C.4's table of boundary steps ----------------------------------------------------------

# s: f(s), η_s, μ_s, tokens/step, long, short, s_attn, 1.2·η_s² (as printed)
TABLE = {
    0: ("1.000", "0.02300", "0.850", 131_072, 3, 1, "0.1", "6.35e-04"),
    300: ("1.000", "0.02300", "0.950", 131_072, 3, 1, "0.1", "6.35e-04"),
    700: ("1.510", "0.03473", "0.950", 131_072, 3, 1, "0.1", "1.45e-03"),
    707: ("1.510", "0.03473", "0.950", 262_144, 7, 3, "0.116946", "1.45e-03"),
    954: ("1.510", "0.03473", "0.950", 262_144, 7, 3, "0.116946", "1.45e-03"),
    1399: ("0.972", "0.02235", "0.950", 262_144, 7, 3, "0.116946", "6.00e-04"),
    1400: ("1.230", "0.02829", "0.950", 262_144, 7, 3, "0.116946", "9.60e-04"),
    1414: ("1.208", "0.02779", "0.950", 393_216, 11, 5, "0.127518", "9.26e-04"),
    2000: ("0.288", "0.00663", "0.950", 393_216, 11, 5, "0.127518", "5.28e-05"),
    2111: ("0.114", "0.00262", "0.948", 393_216, 11, 5, "0.127518", "8.27e-06"),
    2120: ("0.100", "0.00230", "0.930", 393_216, 13, 6, "0.131778", "6.35e-06"),
    2159: ("0.100", "0.00230", "0.852", 393_216, 13, 6, "0.131778", "6.35e-06"),
}


def printed(value: float, like: str) -> str:
    """`value` printed as the table prints `like` (its decimals, or its e-notation)."""
    if "e" in like:
        return f"{value:.2e}"
    return f"{value:.{len(like.split('.')[1])}f}"


@pytest.mark.parametrize("s", list(TABLE))
def test_boundary_rows_are_c4s_table(run, s: int) -> None:
    c, sched, scales = run
    f, eta, mu, tokens, long, short, s_attn, decay = TABLE[s]
    v = sched.at(s)
    lr = c.optim.muon.lr * v.optim.lr_mult
    assert printed(v.optim.lr_mult, f) == f
    assert printed(lr, eta) == eta
    assert printed(v.optim.muon_momentum, mu) == mu
    assert c.train.batch_size * v.seq_len == c.train.step_tokens(s) == tokens
    args = v.model_args
    assert (args["window_tokens"], args["short_window_tokens"]) == (128 * long, 128 * short)
    assert printed(scales[args["yarn_stage"]], s_attn) == s_attn
    assert printed(1.2 * lr**2, decay) == decay


def test_final_validation_row(run) -> None:
    """val 2160: long 20 blocks, short 6 (⌊13/2⌋), s_attn 0.131778: no YaRN step."""
    _, sched, scales = run
    args = sched.model_args(STEPS)
    assert (args["window_tokens"], args["short_window_tokens"]) == (20 * 128, 6 * 128)
    assert args["yarn_stage"] == 3 and printed(scales[3], "0.131778") == "0.131778"
    # An evaluation before the end keeps the step's training windows (C.4).
    assert sched.model_args(2000) == sched.at(2000).model_args


def test_every_step_is_the_reference(run) -> None:
    c, sched, _ = run
    for s in range(STEPS):
        v = sched.at(s)
        assert v.optim.lr_mult == ref_lr(s), s  # C.4's expression, bit for bit
        assert v.optim.muon_momentum == pytest.approx(ref_momentum(s), abs=1e-15), s
        assert c.train.batch_size * v.seq_len == ref_tokens(s), s
        args = v.model_args
        assert args["window_tokens"] == 128 * ref_long(s), s
        assert args["short_window_tokens"] == 128 * (ref_long(s) // 2), s
        assert args["yarn_stage"] == ref_stage(s), s
    # The quirks C.4 names: the peak steps 7 and 14 steps before the batch does.
    assert (sched.at(699).optim.lr_mult, sched.at(700).optim.lr_mult) == (1.0, 1.51)
    assert sched.at(706).seq_len == 16384 < sched.at(707).seq_len
    assert sched.at(1413).seq_len == 32768 < sched.at(1414).seq_len


def test_tokens_per_step_and_in_total(run) -> None:
    """C.5: 707 × 131,072 + 707 × 262,144 + 746 × 393,216 = 571,342,848."""
    c, _, _ = run
    t = c.train
    assert t.tokens_after(STEPS) == 707 * 131_072 + 707 * 262_144 + 746 * 393_216 == 571_342_848
    running = 0
    for s in range(STEPS + 1):
        assert t.tokens_after(s) == running, s
        if s < STEPS:
            running += ref_tokens(s)
    assert [stage_index(s, SCHEDULED, 3) for s in (706, 707, 1413, 1414, 2159)] == [
        0, 1, 1, 2, 2,
    ]  # fmt: skip


# --- YaRN ------------------------------------------------------------------------------------

# C.4's YaRN table: ω_j / ω_j(base) after each change (rows: start, 707, 1414, 2120).
YARN_RATIOS = {
    0: ("1", "1", "1", "1"),
    2: ("1", "1", "1", "1"),
    3: ("1", "0.98615", "0.98615", "0.98615"),
    6: ("1", "0.70466", "0.65730", "0.65730"),
    10: ("1", "0.53056", "0.38173", "0.33843"),
    18: ("1", "0.43027", "0.27429", "0.23223"),
}


def test_yarn_table_is_c4s() -> None:
    base = Rotary(128, mode="half_truncated").inv_freq
    j = torch.arange(32, dtype=torch.float64)
    assert torch.allclose(base[:32].double(), 1024.0 ** (-j / 31), rtol=1e-6)  # 1024^(−j/31)
    assert (base[32:] == 0).all()
    table = yarn_table(base, [3, 7, 11, 13], 128, 0.1)
    assert table.freqs.shape == (4, 64) and table.freqs.dtype == torch.float32
    assert [f"{s:.6f}" for s in table.attn_scales[1:]] == ["0.116946", "0.127518", "0.131778"]
    assert table.attn_scales[0] == 0.1
    ratios = table.freqs[:, :32].double() / base[:32].double()
    for col, want in YARN_RATIOS.items():
        got = [
            f"{r:.5f}" if w != "1" else f"{r:g}" for r, w in zip(ratios[:, col], want, strict=True)
        ]
        assert got == list(want), col
    for k, (n0, n1) in enumerate([(3, 7), (3, 11), (3, 13)], start=1):  # j ≥ 19: N₀/N₁
        assert torch.allclose(ratios[k, 19:], torch.full((13,), n0 / n1, dtype=torch.float64))
    assert (table.freqs[:, 32:] == 0).all()  # zero frequencies stay zero


def test_yarn_table_steps_are_cumulative_and_keep_equal_windows() -> None:
    """Each change starts from the one before's frequencies; an unchanged window changes
    nothing, bit for bit (a stage of window_after equal to the last phase)."""
    base = Rotary(128, mode="half_truncated").inv_freq
    whole = yarn_table(base, [3, 7, 11], 128, 0.1)
    second = yarn_table(whole.freqs[1], [7, 11], 128, whole.attn_scales[1])
    assert torch.equal(second.freqs[1], whole.freqs[2])
    same = yarn_table(base, [3, 3, 7], 128, 0.1)
    assert torch.equal(same.freqs[1], same.freqs[0]) and same.attn_scales[1] == 0.1
    assert torch.equal(same.freqs[2], whole.freqs[1])
    with pytest.raises(ValueError, match="windows"):
        yarn_table(base, [], 128, 0.1)


# --- off by default: record_2025_01_26's preset is today's, bit for bit
# ------------------------------


def test_defaults_leave_record_2025_01_26_bitwise() -> None:
    # model.compile=false only skips the compile-backend check (no schedule reads it).
    c = to_config(
        compose_config(["experiment=record_2025_01_26", "run_dir=.", "model.compile=false"])
    )
    t, s, m = c.train, c.optim.schedule, c.optim.muon
    assert (t.extension_steps, t.stages, t.stages.long_windows) == (0, StageTable(), [])
    assert s.cooldown_form == "fraction"
    assert m.momentum_cooldown_steps == 0 and not c.model.attention.yarn
    run, bare = Schedule.for_run(t, c.optim, c.model), Schedule(t.steps, c.optim, c.model)
    assert run.scheduled_steps == t.steps == 1770
    for step in range(t.steps):
        v = run.at(step)
        assert v.optim.lr_mult == lr_multiplier(step, 1770, 0, 0.4, 0.1, "fraction")
        assert v.optim.muon_momentum == muon_momentum(step, 300, 0.85, 0.95)
        assert v.model_args == {"window_tokens": window_at(step, 1770, 1728)}
        assert v.seq_len == 49152 and bare.at(step).optim == v.optim
    assert (
        run.model_args(1770)
        == {"window_tokens": window_at(1770, 1770, 1728)}
        == {"window_tokens": 1728.0}
    )
    assert t.tokens_after(1770) == 695_992_320  # C.5: record_2025_01_26's total


def test_extension_steps_hold_the_floor_and_the_final_window() -> None:
    """Without peaks, extension steps run at the floor, after the usual cooldown over the
    scheduled steps; record_2025_01_26's linear window stops growing at the scheduled end."""
    c = to_config(
        {
            "train": {"steps": 110, "extension_steps": 10},
            "optim": {"schedule": {"cooldown_frac": 0.4, "min_lr_frac": 0.1}},
            "model": {"attention": {"window": "LS", "window_tokens": 64}},
        }
    )
    sched = Schedule.for_run(c.train, c.optim, c.model)
    for step in range(100):
        assert sched.at(step).optim.lr_mult == lr_multiplier(step, 100, 0, 0.4, 0.1)
        assert sched.at(step).model_args == {"window_tokens": window_at(step, 100, 64)}
    for step in range(100, 111):
        if step < 110:
            assert sched.at(step).optim.lr_mult == 0.1
        assert sched.model_args(step) == {"window_tokens": 64.0}
    assert optim_values(c.optim, 105, 110, 100).lr_mult == 0.1


# --- validation: every bad value names its key ----------------------------------------------


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"train": {"extension_steps": 2160}}, "train.extension_steps"),
        ({"train": {"extension_steps": -1}}, "train.extension_steps"),
        ({"train": {"seq_len": 32768}}, "train.seq_len"),
        (stages(rows=rows(seq_len=[0, 32768, 49152])), "train.stages.rows.0.seq_len"),
        (stages(rows=rows(seq_len=[-1, 32768, 49152])), "train.stages.rows.0.seq_len"),
        (stages(peak_edges=[0.33]), "train.stages.peak_edges"),
        (stages(peak_edges=[0.66, 0.33]), "train.stages.peak_edges"),
        (stages(peak_edges=[0.0, 0.66]), "train.stages.peak_edges"),
        (stages(rows=rows(lr_peak=[1.0, 0.0, 1.9])), "train.stages.rows.1.lr_peak"),
        (stages(rows=rows(lr_peak=[1.0, -1.0, 1.9])), "train.stages.rows.1.lr_peak"),
        ({"optim": {"schedule": {"cooldown_form": "steps"}}}, "optim.schedule.cooldown_form"),
        (stages(rows=rows(lr_peak=[0.0] * 3)), "train.stages.peak_edges needs the rows' lr_peak"),
        ({"optim": {"muon": {"momentum_cooldown_steps": -1}}}, "optim.muon.momentum_cooldown"),
        ({"optim": {"muon": {"momentum_cooldown_end": 1.0}}}, "optim.muon.momentum_cooldown_end"),
        (stages(rows=rows(window=[3, 0, 11])), "train.stages.rows.1.window"),
        ({"model": {"attention": {"window_tokens": 1728}}}, "model.attention.window_tokens"),
        (
            {"model": {"attention": {"window": ""}}},
            "train.stages.rows.N.window needs model.attention.window",
        ),
        (stages(window_after=-1), "train.stages.window_after"),
        (stages(window_final_eval=-2), "train.stages.window_final_eval"),
    ],
)
def test_bad_values_name_their_key(changes: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        record_2025_11_29(**changes)


def test_overlapping_warmup_and_cooldown_are_allowed_and_steps_must_agree() -> None:
    # An overlapping warmup and cooldown is allowed: the warmup wins
    # (test_record_2026_07_17_schedule.py)
    MuonConfig(momentum_cooldown_steps=20, momentum_warmup_steps=10).validate(25)
    with pytest.raises(ValueError, match=r"train\.extension_steps"):
        TrainConfig(steps=10, extension_steps=10, val_tokens=256).validate()
    with pytest.raises(ValueError, match="total_steps"):
        Schedule(10, record_2025_11_29().optim, ModelConfig(), record_2025_11_29().train)
