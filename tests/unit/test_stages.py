"""The stage table (stages/table.py): its one rule against hand-written boundaries of
record_2025_11_29 and record_2026_07_17, every column of a run read through it, its checks, the old
keys' one-line errors and a checkpoint saved with the former parallel lists read as the table."""

import math
import shutil
from dataclasses import asdict
from fractions import Fraction
from pathlib import Path

import pytest

from data.config import DataConfig
from model.config import AttentionConfig, HeadConfig, ModelConfig, update
from model.forward_schedule import check_stages
from optim.config import ScheduleConfig
from optim.schedule import lr_peak_at
from stages import Stage, StageTable, stage_index, stage_start
from stages.moved import MOVED
from tests.helpers import CONF_DIR, compose_config
from trainer.checkpoint.files import CheckpointError, Loaded
from trainer.checkpoint.resume_rules import by_column, check_config, upgrade_saved
from trainer.cli.overrides import check_overrides, compose_and_validate
from trainer.config import Config, TrainConfig, to_config
from trainer.schedule import Schedule

C = ["experiment=record_2025_11_29", "run_dir=.", "model.compile=false"]
D = ["experiment=record_2026_07_17", "run_dir=.", "model.compile=false"]


# --- the rule --------------------------------------------------------------------------------


def test_the_rule_is_the_written_one_and_its_starts_are_its_boundaries() -> None:
    """min(⌊P·s/S⌋, P − 1), and stage i starts at ⌈i·S/P⌉: the first step with index i (no
    stage is empty: a table has at most S rows)."""
    for n in (1, 2, 3, 4, 7):
        for total in (t for t in (1, 5, 7, 100, 1380, 2120) if t >= n):
            for s in range(total + 5):
                assert stage_index(s, total, n) == min(math.floor(Fraction(n * s, total)), n - 1)
            starts = [stage_start(i, total, n) for i in range(n)]
            assert starts == [math.ceil(Fraction(i * total, n)) for i in range(n)]
            for i, first in enumerate(starts[1:], start=1):
                assert stage_index(first, total, n) == i > stage_index(first - 1, total, n)
    with pytest.raises(ValueError, match="step must be >= 0"):
        stage_index(-1, 10, 3)


def test_record_2025_11_29_boundaries() -> None:
    """C.4: 2,120 scheduled steps; stage 1 from 707, stage 2 from 1,414, the extension (2,120
    … 2,159) in the last; the LR plateaus by their own edges after x = 0.33 and 0.66 (700,
    1,400); the extension steps' window 13 is YaRN stage 3."""
    c = to_config(compose_config(C))
    table, sched = c.train.stages, Schedule.for_run(c.train, c.optim, c.model, c.data)
    assert [table.start(i, 2120) for i in range(3)] == [0, 707, 1414]
    assert [table.index(s, 2120) for s in (0, 706, 707, 1413, 1414, 2119, 2159)] == [
        0, 0, 1, 1, 2, 2, 2,
    ]  # fmt: skip
    peaks = {s: lr_peak_at(table, s, 2120) for s in (699, 700, 706, 707, 1399, 1400, 1414)}
    assert peaks == {699: 1.0, 700: 1.51, 706: 1.51, 707: 1.51, 1399: 1.51, 1400: 1.93, 1414: 1.93}
    assert [sched.at(s).seq_len for s in (706, 707, 1413, 1414)] == [16384, 32768, 32768, 49152]
    stages = [sched.at(s).model_args["yarn_stage"] for s in (706, 707, 1414, 2119, 2120)]
    assert stages == [0, 1, 2, 2, 3] and table.long_windows == [3, 7, 11, 13]


def test_record_2026_07_17_boundaries_and_its_mtp_bits() -> None:
    """D.4: 1,380 scheduled steps, stages from 460 and 920, every column switching there;
    the MTP weights as model/mtp_schedule.py writes them, w·(1 − (3x − i)) at x = s/1,380."""
    d = to_config(compose_config(D))
    sched = Schedule.for_run(d.train, d.optim, d.model, d.data)
    assert [d.train.stages.start(i, 1380) for i in range(3)] == [0, 460, 920]
    for s in (0, 459, 460, 919, 920, 1379, 1380, 1389):
        want = 0 if s < 460 else 1 if s < 920 else 2
        v = sched.at(s)
        row = d.train.stages.rows[want]
        assert v.seq_len == row.seq_len and v.data_args["max_pieces"] == row.max_pieces, s
        assert v.data_args["max_piece_len"] == row.max_piece_len, s
        assert v.model_args["window_tokens"] == (13 if s >= 1380 else row.window) * 128, s
        x = s / 1380
        mtp = {0: (1.0, 0.5, 0.25 * (1 - (3 * x - 0))), 1: (1.0, 0.5 * (1 - (3 * x - 1)), 0.0),
               2: (1.0, 0.0, 0.0)}[want]  # fmt: skip
        assert v.model_args["mtp_weights"] == mtp, s
        assert lr_peak_at(d.train.stages, s, 1380) == row.lr_peak, s


def test_peaks_without_edges_switch_with_the_stages() -> None:
    """Without peak_edges the plateau is the step's stage's, min(⌊P·s / S⌋, P − 1), the
    batch's rule; with record_2025_11_29's edges it steps up at x > edge instead."""
    for n in (1, 2, 3, 4):
        table = StageTable(rows=[Stage(lr_peak=1.0 + i) for i in range(n)])
        for total in (1, 5, 7, 1380, 2120):
            for s in range(0, total + 3, max(1, total // 97)):
                assert lr_peak_at(table, s, total) == 1.0 + min(n * s // total, n - 1)
    edges = StageTable(rows=[Stage(lr_peak=p) for p in (1.0, 1.51, 1.93)], peak_edges=[0.33, 0.66])
    assert [lr_peak_at(edges, s, 2120) for s in (699, 700, 1399, 1400)] == [1.0, 1.51, 1.51, 1.93]


# --- the checks: each names its key and row --------------------------------------------------


@pytest.mark.parametrize(
    ("table", "said"),
    [
        (StageTable(rows=[Stage(seq_len=8), Stage(seq_len=-8)]), r"rows\.1\.seq_len must be a"),
        (StageTable(rows=[Stage(window=True)]), r"rows\.0\.window must be a whole number"),
        (StageTable(rows=[Stage(max_pieces=2.5)]), r"rows\.0\.max_pieces must be a whole"),
        (StageTable(rows=[Stage(window=3), Stage()]), r"rows\.1\.window is unset \(0\) while"),
        (StageTable(rows=[Stage(mtp_weights=[1.0]), Stage()]), r"rows\.1\.mtp_weights is unset"),
        (StageTable(rows=[Stage(lr_peak=math.nan)]), r"rows\.0\.lr_peak must be a finite"),
        (StageTable(rows=[Stage(seq_len=8)], window_after=3), r"window_after needs the rows' wi"),
        (StageTable(rows=[Stage(window=3)], window_after=-1), r"window_after must be whole blocks"),
        (StageTable(rows=[Stage(seq_len=8)], mtp_decay=True), r"mtp_decay needs the rows' mtp"),
        (StageTable(rows=[Stage(lr_peak=1.0)] * 2, peak_edges=[0.2, 0.4]), r"one edge fewer"),
        (StageTable(rows=[Stage(seq_len=8)] * 11), r"has 11 stages, more than the 10 scheduled"),
    ],
)  # fmt: skip
def test_a_bad_row_or_entry_is_named_with_its_index(table: StageTable, said: str) -> None:
    with pytest.raises(ValueError, match=rf"train\.stages\.{said}" if "rows" in said else said):
        table.validate(10)


def test_windows_by_stage_need_the_model_to_have_windows() -> None:
    for key, value in (("window_after", 13), ("window_final_eval", 20)):
        with pytest.raises(ValueError, match=rf"train\.stages\.{key} needs the rows' window"):
            StageTable(rows=[Stage(seq_len=8)], **{key: value}).validate(10)
    with pytest.raises(ValueError, match=r"model\.attention\.yarn needs the window by stage"):
        check_stages(update(ModelConfig(), {"attention.yarn": True}), StageTable())
    three = StageTable(rows=[Stage(seq_len=n) for n in (2, 3, 4)])
    with pytest.raises(ValueError, match=r"train\.stages\.rows has 3 stages, more than the 2"):
        TrainConfig(steps=3, extension_steps=1, seq_len=4, stages=three, val_tokens=256).validate()
    StageTable(rows=[Stage(lr_peak=2.0)]).validate(10)  # one stage's peak, no edges


# --- the old keys: one line naming the new one -----------------------------------------------


@pytest.mark.parametrize("old", MOVED)
def test_an_old_key_on_the_command_line_names_its_new_one(old: str) -> None:
    with pytest.raises(ValueError, match=rf"^{old} is now train\.stages\.") as e:
        check_overrides([f"{old}=[1]"], CONF_DIR, Config)
    assert "\n" not in str(e.value) and "docs/config.md" in str(e.value)


def test_an_old_key_in_a_config_file_or_a_dict_names_its_new_one(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\ntrain:\n  seq_len_phases: [8, 16]\n"
    )
    with pytest.raises(ValueError, match=r"^train\.seq_len_phases is now .*, in the config file"):
        compose_and_validate(["experiment=mine"], conf)
    with pytest.raises(ValueError, match=r"^optim\.schedule\.peaks is now train\.stages\.rows\.N"):
        to_config({"optim": {"schedule": {"peaks": [1.0]}}})
    with pytest.raises(ValueError, match=r"^model\.window_phases is now train\.stages\.rows\.N"):
        to_config({"model": {"window_phases": [3]}})
    with pytest.raises(ValueError, match=r"^unknown config key train\.stages\.rows\.0\.windw"):
        to_config({"train": {"stages": {"rows": [{"windw": 3}]}}})


@pytest.mark.parametrize(
    ("cls", "group", "name"),
    [(TrainConfig, "train", "seq_len_phases"), (DataConfig, "data", "max_piece_len_phases"),
     (DataConfig, "data", "max_pieces"), (ScheduleConfig, "optim.schedule", "peaks"),
     (ScheduleConfig, "optim.schedule", "peak_edges"),
     (AttentionConfig, "model.attention", "window_phases"),
     (AttentionConfig, "model.attention", "window_after"),
     (HeadConfig, "model.head", "mtp_weights")],
)  # fmt: skip
def test_python_callers_get_the_same_line(cls: type, group: str, name: str) -> None:
    said = rf"^{group}\.{name} is now train\.stages\."
    with pytest.raises(TypeError, match=said):
        cls(**{name: [1]})
    cfg = cls()
    with pytest.raises(AttributeError, match=said):
        getattr(cfg, name)
    with pytest.raises(AttributeError, match=said):
        setattr(cfg, name, [1])
    with pytest.raises(AttributeError, match=r"has no attribute 'nothing'"):
        _ = cfg.nothing


def test_the_model_configs_own_routes_name_the_new_key() -> None:
    with pytest.raises(AttributeError, match=r"model\.attention\.window_phases is now train\.st"):
        update(ModelConfig(), {"attention.window_phases": [3]})
    with pytest.raises(AttributeError, match=r"model\.window_after is now train\.stages\.window_"):
        update(ModelConfig(), {"window_after": 13})
    with pytest.raises(AttributeError, match=r"model\.window_phases is now train\.stages\.rows"):
        _ = ModelConfig().window_phases


# --- a checkpoint saved with the parallel lists ----------------------------------------------


def old_form(conf: Config) -> dict:
    """`conf` as a config saved before the stage table: its rows as the former lists."""
    saved = asdict(conf)
    table = saved["train"].pop("stages")
    column = {c: [r[c] for r in table["rows"]] for c in asdict(Stage())}
    saved["train"]["seq_len_phases"] = column["seq_len"]
    for old, new in (("max_piece_len_phases", "max_piece_len"), ("max_pieces", "max_pieces")):
        saved["data"][old] = column[new] if any(column[new]) else []
    saved["optim"]["schedule"] |= {"peaks": column["lr_peak"], "peak_edges": table["peak_edges"]}
    saved["model"]["attention"] |= {"window_phases": column["window"],
                                    "window_after": table["window_after"],
                                    "window_final_eval": table["window_final_eval"]}  # fmt: skip
    saved["model"]["head"]["mtp_weights"] = [1.0, 0.5, 0.25]  # the former default, saved always
    return saved


@pytest.mark.parametrize("preset", [C, D], ids=["record_2025_11_29", "record_2026_07_17"])
def test_a_config_saved_with_the_lists_reads_as_the_table(preset: list[str]) -> None:
    conf = to_config(compose_config(preset))
    saved = upgrade_saved(old_form(conf))
    assert by_column(saved)["train"]["stages"] == by_column(asdict(conf))["train"]["stages"]
    loaded = Loaded(Path("ckpt"), {"config": old_form(conf)}, {})
    check_config(loaded, conf, warn=True)  # resumes: nothing differs
    other = to_config(compose_config([*preset, "train.stages.rows.1.window=9"]))
    with pytest.raises(CheckpointError, match=r"train\.stages\.rows\.window: \[3, 7, 11\] saved"):
        check_config(loaded, other, warn=True)
    pieces = to_config(compose_config([*D, "train.stages.rows.2.max_pieces=200"]))
    if preset is D:  # a piece limit may change on resume, silently
        check_config(loaded, pieces, warn=True)


def test_the_lists_of_a_flat_model_config_and_their_constants() -> None:
    """The flat schema's model.window_phases, and a one-entry list filling every row."""
    saved = upgrade_saved({"model": {"window": "LS", "window_phases": [3, 7], "window_after": 9},
                           "data": {"max_pieces": [5]}, "train": {}})  # fmt: skip
    table = saved["train"]["stages"]
    assert [(r["window"], r["max_pieces"]) for r in table["rows"]] == [(3, 5), (7, 5)]
    assert table["window_after"] == 9 and "window_phases" not in saved["model"]
    with pytest.raises(CheckpointError, match=r"stage lists make no stage table: .* of 2 and 3"):
        upgrade_saved({"train": {"seq_len_phases": [8, 16, 24]}, "data": {"max_pieces": [3, 4]}})
    plain = upgrade_saved({"model": {"head": {"mtp": False, "mtp_weights": [1.0, 0.5]}}})
    assert plain["train"]["stages"] == asdict(StageTable())
    assert "mtp_weights" not in plain["model"]["head"]
