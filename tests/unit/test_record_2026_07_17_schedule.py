"""record_2026_07_17's schedules and batches (docs/records.md D.4, D.5, D.10 item 9), through the
objects a run calls (`Schedule.for_run`, `yarn_table`, `PieceLoader`), from record_2026_07_17's
keys: RECORD_2026_07_17 below, the schedule, stage table and data part the experiment preset takes.

The expected numbers are D.4's table of boundary steps, to its printed digits, and references
written here in float64 from D.4's formulas (no project module inside them). Negative controls:
plausible misreadings (record_2025_11_29's peak edges, peaks, floor or cooldown; the momentum
cooldown on top of the warmup; one piece cap throughout) must fail the same checks.
"""

import itertools
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

from data.pieces import PieceLoader
from data.token_shards import write_shard
from model.rotary import Rotary
from model.yarn import yarn_table
from optim.config import OptimConfig, ScheduleConfig
from optim.schedule import optim_values
from stages import StageTable
from tests.helpers import compose_config
from trainer.config import Config, to_config
from trainer.schedule import Schedule

STEPS, SCHEDULED = 1390, 1380  # D.4: 1,380 scheduled + 10 extension steps
ROOT = Path(__file__).resolve().parents[2]
# record_2026_07_17's stage table by column (D.4, D.5): three equal stages of the 1,380 scheduled
# steps
COLUMNS = {
    "seq_len": [16384, 32768, 49152], "window": [3, 7, 11], "max_piece_len": [896, 2048, 2048],
    "max_pieces": [63, 95, 127], "lr_peak": [1.0, 1.52, 1.73],
    "mtp_weights": [[1.0, 0.5, 0.25], [1.0, 0.5], [1.0]],
}  # fmt: skip


def rows(**changes: list) -> list[dict]:
    """record_2026_07_17's rows with `changes` ({column: a value per row}) in place of its
    columns."""
    columns = COLUMNS | changes
    per_row = zip(*columns.values(), strict=True)
    return [dict(zip(columns, values, strict=True)) for values in per_row]


RECORD_2026_07_17 = {
    "train": {"steps": 1390, "extension_steps": 10, "batch_size": 8, "micro_batch_size": 1,
              "seq_len": 49152, "val_seq_len": 262144,
              "stages": {"rows": rows(), "window_after": 13, "window_final_eval": 20,
                         "mtp_decay": True, "peak_edges": []}},
    "data": {"align": "pieces", "max_piece_len": 2048, "val_tokens": 10_485_760},
    "optim": {
        "muon": {"lr": 0.023, "momentum": 0.95, "momentum_warmup_start": 0.85,
                 "momentum_warmup_steps": 300, "momentum_cooldown_steps": 50,
                 "momentum_cooldown_end": 0.85},
        "schedule": {"warmup_steps": 0, "cooldown_frac": 0.6, "min_lr_frac": 0.15,
                     "cooldown_form": "from_step"},
    },
}  # fmt: skip


def record_2026_07_17(**changes: dict) -> Config:
    """The preset, experiment=record_2026_07_17 (which the first test holds to RECORD_2026_07_17),
    validated, with `changes` merged in."""
    preset = compose_config(["experiment=record_2026_07_17", "model.compile=false", "run_dir=."])
    return to_config(OmegaConf.merge(preset, changes))


def test_the_preset_holds_record_2026_07_17_schedule_and_batches() -> None:
    """Every key of RECORD_2026_07_17 (D.4, D.5) is the preset's value."""
    preset = compose_config(["experiment=record_2026_07_17"])
    resolved = {key: OmegaConf.to_container(preset[key], resolve=True) for key in RECORD_2026_07_17}

    def walk(want: dict, got: dict, path: str) -> None:
        for key, value in want.items():
            if isinstance(value, dict):
                walk(value, got[key], f"{path}{key}.")
            else:
                assert got[key] == value, f"{path}{key}: {got[key]!r} != {value!r}"

    walk(RECORD_2026_07_17, resolved, "")


@pytest.fixture(scope="module")
def run() -> tuple[Config, Schedule, list[float]]:
    c = record_2026_07_17()
    att = c.model.attention
    freqs = Rotary(c.model.head_dim, mode=att.rope).inv_freq
    windows = c.train.stages.long_windows
    scales = yarn_table(freqs, windows, att.window_block, att.scale).attn_scales
    return c, Schedule.for_run(c.train, c.optim, c.model, c.data), scales


# --- the reference, from D.4's formulas (float64) --------------------------------------------


def ref_stage(s: int) -> int:
    return 0 if s < 460 else 1 if s < 920 else 2


def ref_lr(s: int) -> float:
    if s >= 1380:
        return 0.15
    p = (1.00, 1.52, 1.73)[ref_stage(s)]
    if s < 552:
        return p
    tau = min(1.0, (s - 552) / 828)
    return p * (1 - tau) + 0.15 * tau


def ref_momentum(s: int) -> float:
    if s < 300:
        return 0.85 + 0.1 * s / 300
    return 0.95 if s <= 1340 else 0.95 - 0.1 * (s - 1340) / 50


# --- D.4's table, every row -----------------------------------------------------------------

# s: f(s), η_s, μ_s, tokens/step, short, long, s_attn, K, last MTP weight, 1.2·η_s² (printed)
TABLE = {
    0: ("1.000", "0.02300", "0.850", 131_072, 1, 3, "0.1", 3, "0.25", "6.35e-4"),
    300: ("1.000", "0.02300", "0.950", 131_072, 1, 3, "0.1", 3, "0.087", "6.35e-4"),
    459: ("1.000", "0.02300", "0.950", 131_072, 1, 3, "0.1", 3, "0.0005", "6.35e-4"),
    460: ("1.520", "0.03496", "0.950", 262_144, 3, 7, "0.116946", 2, "0.5", "1.47e-3"),
    552: ("1.520", "0.03496", "0.950", 262_144, 3, 7, "0.116946", 2, "0.4", "1.47e-3"),
    919: ("0.913", "0.02099", "0.950", 262_144, 3, 7, "0.116946", 2, "0.0011", "5.29e-4"),
    920: ("1.028", "0.02364", "0.950", 393_216, 5, 11, "0.127518", 1, "1", "6.71e-4"),
    1000: ("0.875", "0.02013", "0.950", 393_216, 5, 11, "0.127518", 1, "1", "4.86e-4"),
    1250: ("0.398", "0.00916", "0.950", 393_216, 5, 11, "0.127518", 1, "1", "1.01e-4"),
    1341: ("0.224", "0.00516", "0.948", 393_216, 5, 11, "0.127518", 1, "1", "3.20e-5"),
    1380: ("0.150", "0.00345", "0.870", 393_216, 6, 13, "0.131778", 1, "1", "1.43e-5"),
    1389: ("0.150", "0.00345", "0.852", 393_216, 6, 13, "0.131778", 1, "1", "1.43e-5"),
}


def printed(value: float, like: str) -> str:
    """`value` printed as the table prints `like`: its decimals, or its e-notation (e-4)."""
    if "e" in like:
        mantissa, exponent = f"{value:.{len(like.split('e')[0]) - 2}e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.{len(like.split('.')[1]) if '.' in like else 0}f}"


def row(c: Config, sched: Schedule, scales: list[float], s: int) -> tuple:
    """Row s of the table as this project computes and prints it."""
    v, like = sched.at(s), TABLE[s]
    eta = c.optim.muon.lr * v.optim.lr_mult
    args = v.model_args
    mtp = [w for w in args["mtp_weights"] if w != 0]
    block = c.model.attention.window_block
    return (
        printed(v.optim.lr_mult, like[0]), printed(eta, like[1]),
        printed(v.optim.muon_momentum, like[2]), c.train.step_tokens(s),
        args["short_window_tokens"] // block, args["window_tokens"] // block,
        printed(scales[args["yarn_stage"]], like[6]), len(mtp), printed(mtp[-1], like[8]),
        printed(1.2 * eta**2, like[9]),
    )  # fmt: skip


@pytest.mark.parametrize("s", list(TABLE))
def test_every_row_is_d4s_table(run, s: int) -> None:
    c, sched, scales = run
    assert row(c, sched, scales, s) == TABLE[s]
    assert c.train.batch_size * sched.at(s).seq_len == TABLE[s][3]  # 8 ranks × L


def test_final_validation_row(run) -> None:
    """val 1390: long 20 blocks, short 6, s_attn 0.131778 (no YaRN step)."""
    _, sched, scales = run
    args = sched.model_args(STEPS)
    assert (args["short_window_tokens"], args["window_tokens"]) == (6 * 128, 20 * 128)
    assert printed(scales[args["yarn_stage"]], "0.131778") == "0.131778"
    assert [f"{x:.6f}" for x in scales] == ["0.100000", "0.116946", "0.127518", "0.131778"]


@pytest.mark.parametrize(
    "misreading",
    [
        {"train": {"stages": {"peak_edges": [0.33, 0.66]}}},  # record_2025_11_29's edges: 456, 911
        # record_2025_11_29's peaks
        {"train": {"stages": {"rows": rows(lr_peak=[1.0, 1.51, 1.93])}}},
        {"optim": {"schedule": {"min_lr_frac": 0.1}}},  # record_2025_11_29's floor
        {"optim": {"schedule": {"cooldown_frac": 0.55}}},  # record_2025_11_29's cooldown
        {"optim": {"muon": {"momentum_cooldown_steps": 40}}},  # cooldown over the extension
    ],
)
def test_misreadings_fail_the_table(misreading: dict) -> None:
    c = record_2026_07_17(**misreading)
    sched = Schedule.for_run(c.train, c.optim, c.model, c.data)
    scales = [0.1, 0.116946, 0.127518, 0.131778]
    assert any(row(c, sched, scales, s)[:3] != TABLE[s][:3] for s in TABLE)


# --- every step: the formulas, and one switch at exactly 460 / 920 / 1380 --------------------


def test_every_step_is_the_reference(run) -> None:
    c, sched, _ = run
    for s in range(STEPS):
        v = sched.at(s)
        assert v.optim.lr_mult == ref_lr(s), s  # D.4's expression, in its order: bit for bit
        assert v.optim.muon_momentum == pytest.approx(ref_momentum(s), abs=1e-15), s
        stage = ref_stage(s)
        assert v.seq_len == (16384, 32768, 49152)[stage], s
        assert v.data_args == {"max_piece_len": (896, 2048, 2048)[stage],
                               "max_pieces": (63, 95, 127)[stage]}, s  # fmt: skip
        assert sum(w != 0 for w in v.model_args["mtp_weights"]) == 3 - stage, s
        assert v.model_args["yarn_stage"] == (3 if s >= 1380 else stage), s
    # The quirk: f jumps up inside the cooldown as the peak steps with the stage.
    assert f"{sched.at(919).optim.lr_mult:.3f} {sched.at(920).optim.lr_mult:.3f}" == "0.913 1.028"
    assert c.train.tokens_after(STEPS) == 460 * 131_072 + 460 * 262_144 + 470 * 393_216
    assert c.train.tokens_after(STEPS) == 365_690_880


# --- the data: piece cap 896 → 2048 by stage, the pieces limit as an error --------------------

B = 50256  # the BOS


def docs(lengths: list[int], seed: int = 0) -> np.ndarray:
    """Documents of these lengths, each a BOS and random ids."""
    rng = np.random.default_rng(seed)
    return np.concatenate([[B, *rng.integers(0, 1000, n - 1)] for n in lengths])


def piece_lengths(row: np.ndarray) -> list[int]:
    """The lengths of a row's pieces, by their BOS tokens (the last one cut at the row end)."""
    starts = [*np.flatnonzero(row == B), len(row)]
    return [b - a for a, b in itertools.pairwise(starts)]


def reference_buffers(tokens: np.ndarray, steps: list[tuple[int, int]], rows: int) -> list:
    """D.5's (C.5's) loop with a cap per step: pieces from successive BOS, each at most the
    cap, until a buffer holds L + 1 tokens."""
    bos, k, out = list(np.flatnonzero(tokens == B)), 0, []
    for seq_len, cap in steps:
        batch = []
        for _ in range(rows):
            buf: list[int] = []
            while len(buf) < seq_len + 1:
                c = bos[k]
                nxt = bos[k + 1] if k + 1 < len(bos) else len(tokens)
                buf.extend(tokens[c : min(nxt, c + cap, c + seq_len + 1 - len(buf))])
                k += 1
            batch.append(buf)
        out.append(np.array(batch))
    return out


def toy_run(tmp_path: Path, caps: list[int], limits: list[int], lengths: list[int]):
    """record_2026_07_17's data keys at toy size: 6 scheduled steps + 1 extension, L = 8/16/24."""
    write_shard(tmp_path / "train_000000.bin", docs(lengths))
    table = [{"seq_len": n, "max_piece_len": cap} for n, cap in zip((8, 16, 24), caps, strict=True)]
    for row, limit in zip(table, limits, strict=False):
        row["max_pieces"] = limit
    c = to_config({
        "train": {"steps": 7, "extension_steps": 1, "batch_size": 2, "seq_len": 24,
                  "stages": {"rows": table}, "val_tokens": 24},
        "data": {"align": "pieces", "max_piece_len": max(caps)},
    })  # fmt: skip
    sched = Schedule.for_run(c.train, c.optim, c.model, c.data)
    loaders = [PieceLoader([tmp_path / "train_000000.bin"], 2, 24, 12, r, 2) for r in (0, 1)]
    return sched, loaders


def test_piece_cap_switches_with_the_stage(tmp_path: Path) -> None:
    lengths = [11, 3, 9, 12, 2, 7] * 30
    sched, loaders = toy_run(tmp_path, [4, 12, 12], [], lengths)
    steps = [(sched.at(s).seq_len, sched.at(s).data_args["max_piece_len"]) for s in range(7)]
    assert steps == [(8, 4), (8, 4), (16, 12), (16, 12), (24, 12), (24, 12), (24, 12)]
    want = reference_buffers(docs(lengths), steps, 2)
    capped_once = reference_buffers(docs(lengths), [(n, 12) for n, _ in steps], 2)
    for s in range(7):
        v = sched.at(s)
        got = np.concatenate([ld.next_batch(v.seq_len, **v.data_args)[0].numpy() for ld in loaders])
        assert np.array_equal(got, want[s][:, :-1]), s
        longest = max(max(piece_lengths(r)) for r in got)
        assert longest == 4 if s < 2 else longest > 4, s  # 896 in stage 1, 2,048 after
    assert not np.array_equal(want[0], capped_once[0])  # the cap bites in stage 1


def test_more_pieces_than_the_limit_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """Documents of 2 tokens: a buffer of L + 1 = 9 tokens packs 5 pieces (4 whole and a
    1-token one, which counts). A limit of 5 serves it, 4 fails on every rank, naming
    train.stages.rows.N.max_pieces, before the batch is consumed; nothing is truncated."""
    sched, loaders = toy_run(tmp_path, [12, 12, 12], [5, 8, 12], [2] * 200)
    v = sched.at(0)
    assert v.data_args == {"max_piece_len": 12, "max_pieces": 5}
    for ld in loaders:  # inputs: 4 pieces; the 5th's BOS is the last target
        x, y = (t.numpy()[0] for t in ld.next_batch(8, **v.data_args))
        assert piece_lengths(x) == [2, 2, 2, 2] and y[-1] == B
    state = loaders[0].state_dict()
    for ld in loaders:
        with pytest.raises(
            ValueError, match=r"5 document pieces, more than this stage's train\.stages\.rows"
        ):
            ld.next_batch(8, max_pieces=4)
        assert ld.state_dict() == state


STREAM = {"align": "stream", "max_piece_len": 0}


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"data": STREAM}, r"train\.stages\.rows\.N\.max_piece_len only applies to data\.align=p"),
        (
            {"train": {"stages": {"rows": rows(max_piece_len=[896, 0, 2048])}}},
            r"train\.stages\.rows\.1\.max_piece_len is unset \(0\)",
        ),
        ({"data": {"max_piece_len": 4096}}, r"data\.max_piece_len \(4096\) must equal the largest"),
        (
            {"train": {"stages": {"rows": rows(max_pieces=[63, 0, 127])}}},
            r"train\.stages\.rows\.1\.max_pieces is unset",
        ),
        (
            {"data": STREAM, "train": {"stages": {"rows": rows(max_piece_len=[0, 0, 0])}}},
            r"train\.stages\.rows\.N\.max_pieces only applies",
        ),
        ({"optim": {"schedule": {"cooldown_form": "steps"}}}, r"lr_peak needs .*from_step"),
        ({"train": {"stages": {"peak_edges": [0.5]}}}, r"train\.stages\.peak_edges needs one"),
    ],
)
def test_bad_values_name_their_key(changes: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        record_2026_07_17(**changes)


def test_stage_keys_default_off() -> None:
    d = to_config({})  # the default run: no stages, no loader arguments, no plateaus
    assert d.train.stages == StageTable() and d.train.stages.long_windows == []
    sched = Schedule.for_run(d.train, d.optim, d.model, d.data)
    assert sched.at(0).data_args == {} and sched.at(0).model_args == {}
    # from_step without peaks: 1 before ⌊S·(1 − frac)⌋, then the line to the floor
    s = OptimConfig(schedule=ScheduleConfig(cooldown_frac=0.5, min_lr_frac=0.1,
                                            cooldown_form="from_step"))  # fmt: skip
    assert [optim_values(s, i, 10).lr_mult for i in (4, 5, 9)] == [
        1.0,
        1.0,
        1.0 * (1 - 0.8) + 0.1 * 0.8,
    ]
