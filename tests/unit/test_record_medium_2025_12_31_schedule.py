"""record_medium_2025_12_31's schedules and batches (docs/records.md M.4, M.5, M.10 item 8), through
the objects a run calls (`Schedule.for_run`, `yarn_table`), from the preset itself
(experiment=record_medium_2025_12_31).

The expected numbers are M.4's table of boundary steps, every row to its printed digits: the
LR multiplier f(s) and η_s, the momentum μ_s, the tokens per step, the short and long windows,
the attention scale s_attn, the MTP weights' count and last weight, and 1.2·η_s². Negative
controls: plausible misreadings (the plateaus switching with the batch at 1,175, YaRN at every
window change, record_2025_11_29's cooldown fraction) must fail the same check.
"""

import pytest
from omegaconf import OmegaConf

from model.rotary import Rotary
from model.yarn import yarn_table
from tests.helpers import compose_config
from trainer.config import Config, to_config
from trainer.schedule import Schedule

# M.4's "Values at boundary steps": s -> (f, η, μ, tokens/step, short, long, s_attn, K, last
# weight of K > 1, 1.2·η²)
M4 = {  # as printed: strings carry the table's digits
    0: ("1.000", "0.01500", "0.850", 131_072, 1, 3, "0.1", 3, "0.25", "2.70e-4"),
    300: ("1.000", "0.01500", "0.950", 131_072, 1, 3, "0.1", 3, "0.0585", "2.70e-4"),
    391: ("1.000", "0.01500", "0.950", 131_072, 1, 3, "0.1", 3, "0.0004", "2.70e-4"),
    392: ("1.520", "0.02280", "0.950", 262_144, 3, 7, "0.116946", 2, "0.4996", "6.24e-4"),
    783: ("1.520", "0.02280", "0.950", 262_144, 3, 7, "0.116946", 2, "0.0004", "6.24e-4"),
    784: ("1.730", "0.02595", "0.950", 393_216, 5, 11, "0.127518", 1, None, "8.08e-4"),
    785: ("1.730", "0.02595", "0.950", 393_216, 5, 11, "0.127518", 1, None, "8.08e-4"),
    1175: ("1.730", "0.02595", "0.950", 524_288, 6, 13, "0.131778", 1, None, "8.08e-4"),
    1176: ("2.000", "0.03000", "0.950", 524_288, 6, 13, "0.131778", 1, None, "1.08e-3"),
    1410: ("2.000", "0.03000", "0.950", 524_288, 6, 13, "0.131778", 1, None, "1.08e-3"),
    1567: ("1.909", "0.02864", "0.950", 524_288, 7, 15, "0.131778", 1, None, "9.84e-4"),
    1959: ("1.683", "0.02524", "0.950", 524_288, 8, 17, "0.131778", 1, None, "7.65e-4"),
    2350: ("1.457", "0.02186", "0.950", 524_288, 9, 19, "0.131778", 1, None, "5.73e-4"),
    2742: ("1.231", "0.01846", "0.950", 524_288, 10, 21, "0.131778", 1, None, "4.09e-4"),
    3134: ("1.004", "0.01507", "0.950", 524_288, 11, 23, "0.131778", 1, None, "2.72e-4"),
    4000: ("0.504", "0.00756", "0.950", 524_288, 11, 23, "0.131778", 1, None, "6.87e-5"),
    4691: ("0.105", "0.00158", "0.948", 524_288, 11, 23, "0.131778", 1, None, "2.99e-6"),
    4700: ("0.100", "0.00150", "0.930", 524_288, 11, 23, "0.131778", 1, None, "2.70e-6"),
    4739: ("0.100", "0.00150", "0.852", 524_288, 11, 23, "0.131778", 1, None, "2.70e-6"),
}
FINAL = (11, 27, "0.131778")  # the validation after step 4,739: short / long, s_attn


def record_medium_2025_12_31(*overrides: str) -> Config:
    preset = ["experiment=record_medium_2025_12_31", "model.compile=false", "run_dir=."]
    return to_config(compose_config([*preset, *overrides]))


def printed(got: float, want: str) -> bool:
    """`got` as the table prints `want`: the same decimals, or the same e-notation digits."""
    if "e" in want:
        places = len(want.split("e")[0].split(".")[1])
        return f"{got:.{places}e}" == f"{float(want):.{places}e}"
    return f"{got:.{len(want.split('.')[1])}f}" == want


def rows(cfg: Config) -> dict[int, tuple]:
    """M.4's columns at its boundary steps, as the run computes them."""
    sched = Schedule.for_run(cfg.train, cfg.optim, cfg.model, cfg.data)
    att = cfg.model.attention
    rotary = Rotary(cfg.model.head_dim, mode=att.rope)
    scales = yarn_table(rotary.inv_freq, cfg.train.stages.long_windows, att.window_block, att.scale,
                        att.yarn_max_window).attn_scales  # fmt: skip
    out = {}
    for s in [*M4, cfg.train.steps]:
        args = sched.model_args(s)
        window = (args["short_window_tokens"] / 128, args["window_tokens"] / 128)
        scale = scales[args["yarn_stage"]]
        if s == cfg.train.steps:
            out[s] = (*window, scale)
            continue
        v = sched.at(s)
        eta = cfg.optim.muon.lr * v.optim.lr_mult
        weights = [w for w in args["mtp_weights"] if w]
        last = weights[-1] if len(weights) > 1 else None
        tokens = v.seq_len * cfg.train.batch_size
        out[s] = (v.optim.lr_mult, eta, v.optim.muon_momentum, tokens, *window, scale,
                  len(weights), last, 1.2 * eta**2)  # fmt: skip
    return out


def matches(got: dict[int, tuple]) -> list[str]:
    """The entries of `got` that M.4 prints otherwise: [] when every one agrees."""
    wrong = []
    for s, want in [*M4.items(), (4740, FINAL)]:
        for k, (a, b) in enumerate(zip(got[s], want, strict=True)):
            same = printed(a, b) if isinstance(b, str) else a == b
            if not same:
                wrong.append(f"step {s} column {k}: {a!r} != {b!r}")
    return wrong


def test_every_row_of_m4_is_the_presets() -> None:
    cfg = record_medium_2025_12_31()
    assert (cfg.train.steps, cfg.train.extension_steps) == (4740, 40)
    assert matches(rows(cfg)) == []


@pytest.mark.parametrize(
    "misreading",
    [
        ["train.stages.peak_edges=[]"],  # the plateaus with the batch: 2.0 at 1,175
        ["model.attention.yarn_max_window=0"],  # YaRN at every window change
        ["optim.schedule.cooldown_frac=0.55"],  # record_2025_11_29's cooldown
    ],
)
def test_misreadings_fail_the_table(misreading: list[str]) -> None:
    assert matches(rows(record_medium_2025_12_31(*misreading)))


def test_the_batches_and_pieces_by_stage() -> None:
    """M.5: per-rank sequences of 16,384 / 32,768 / 49,152 / 65,536 tokens switching at the
    first step of each of the first four twelfths (392, 784, 1,175), pieces capped at 4,096
    and at most 127 / 127 / 255 / 255 per rank sequence (its cu_seqlens of 128 / 128 / 256 /
    256), 2,176,974,848 training tokens in all; validation on 262,144-token sequences."""
    cfg = record_medium_2025_12_31()
    sched = Schedule.for_run(cfg.train, cfg.optim, cfg.model, cfg.data)
    seq = [sched.at(s).seq_len for s in range(cfg.train.steps)]
    switches = [s for s in range(1, len(seq)) if seq[s] != seq[s - 1]]
    assert switches == [392, 784, 1175] and seq[0] == 16384 and seq[-1] == 65536
    assert sum(seq) * cfg.train.batch_size == 2_176_974_848
    pieces = {sched.data_args(s)["max_pieces"] for s in range(0, 392)}
    assert pieces == {127} and sched.data_args(1175)["max_pieces"] == 255
    assert sched.data_args(784) == {"max_pieces": 255} and cfg.data.max_piece_len == 4096
    assert cfg.train.val_seq_len == 262_144 and cfg.data.val_tokens == 10_485_760
    assert cfg.train.val_every == 250 and cfg.train.reference.target == 2.92
    assert OmegaConf.select(compose_config(["experiment=record_medium_2025_12_31"]),
                            "data.fineweb_shards") == 33  # fmt: skip
