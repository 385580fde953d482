"""The size axis (conf/size/, conf/preset_size/): every preset has a toy; a size changes exactly
the keys its overlay files name, and nothing else of the preset; `size=full` changes nothing;
the stage table's columns replace one column and keep the others; and scripts/bitwise.py's
key-by-key spelling of a toy composes to the same config as `size=toy`."""

from dataclasses import asdict
from pathlib import Path

import pytest
import yaml

from stages import Stage, StageTable
from tests.helpers import CONF_DIR, compose_config
from trainer.config import to_config

EXPERIMENTS = sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))
RECORDS = [e for e in EXPERIMENTS if e.startswith("record_")]
# Keys that follow another through an interpolation: they change where it does
FOLLOWS = {"optim.compile": "model.compile", "train.val_seq_len": "train.val_tokens"}


def leaves(tree, prefix: str = "") -> dict:
    """Every leaf of a nested dict or list, by its dotted path."""
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, list):
        items = enumerate(tree)
    else:
        return {prefix: tree}
    return {k: v for key, sub in items for k, v in leaves(sub, f"{prefix}{key}.").items()} or {
        prefix: tree
    }


def config_leaves(overrides: list[str]) -> dict:
    conf = to_config(compose_config([*overrides, "run_dir=."]))
    return {k.rstrip("."): v for k, v in leaves(asdict(conf)).items()}


def named_keys(path: Path, rows: int) -> set[str]:
    """The keys an overlay file sets; a stage column names that key of every row."""
    keys = set()
    for key in (k.rstrip(".") for k in leaves(yaml.safe_load(path.read_text()) or {})):
        if key.startswith("train.stages.columns."):
            column = key.split(".")[3]
            keys |= {f"train.stages.rows.{i}.{column}" for i in range(rows)}
        else:
            keys.add(key)
    return keys


def test_every_preset_has_a_toy_and_every_overlay_a_preset() -> None:
    """A new preset without a toy fails here, not at a user's `size=toy` (which would keep its
    full width on the sample corpus)."""
    toys = sorted(p.stem for p in (CONF_DIR / "preset_size/toy").glob("*.yaml"))
    assert toys == EXPERIMENTS
    sizes = {p.stem for p in (CONF_DIR / "size").glob("*.yaml")}
    for overlay in (CONF_DIR / "preset_size").glob("*/*.yaml"):
        assert overlay.parent.name in sizes and overlay.stem in EXPERIMENTS, overlay


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_full_size_is_the_preset_itself(experiment: str) -> None:
    assert config_leaves([f"experiment={experiment}", "size=full"]) == config_leaves(
        [f"experiment={experiment}"]
    )


@pytest.mark.parametrize("size", ["toy", "gpu_toy"])
@pytest.mark.parametrize("experiment", RECORDS)
def test_a_size_changes_only_the_keys_its_overlays_name(experiment: str, size: str) -> None:
    """Against the overlay files read as plain YAML: every key the preset has that neither the
    size's file nor the preset's own overlay names keeps the preset's value (a stage table
    restated whole would drop the windows, LR peaks and MTP weights of its rows)."""
    full = config_leaves([f"experiment={experiment}"])
    sized = config_leaves([f"experiment={experiment}", f"size={size}"])
    assert full.keys() == sized.keys()
    rows = len(
        to_config(compose_config([f"experiment={experiment}", "run_dir=."])).train.stages.rows
    )
    named = named_keys(CONF_DIR / "size" / f"{size}.yaml", rows)
    own = CONF_DIR / "preset_size" / size / f"{experiment}.yaml"
    named |= named_keys(own, rows) if own.exists() else set()
    if size == "toy":  # the toy's corpus: the data group's every key may change
        named |= {k for k in full if k.startswith("data.")}
    named |= {k for k, source in FOLLOWS.items() if source in named}
    changed = {k for k in full if full[k] != sized[k]}
    assert changed <= named, sorted(changed - named)


@pytest.mark.parametrize("experiment", RECORDS)
def test_each_record_toy_reaches_every_stage_in_its_steps(experiment: str) -> None:
    """A toy trains through all its preset's stages: every stage gets a step, on the sample
    corpus, eager, two sequences a step."""
    conf = to_config(compose_config([f"experiment={experiment}", "size=toy", "run_dir=."]))
    t = conf.train
    if t.stages.rows:
        reached = {t.stages.index(s, t.scheduled_steps) for s in range(t.steps)}
        assert reached == set(range(len(t.stages.rows)))
    assert conf.data.source == "sample" and not conf.model.compile and t.batch_size == 2


def test_stage_columns_replace_one_column_and_keep_the_rest() -> None:
    rows = [
        Stage(seq_len=16384, window=3, lr_peak=1.0),
        Stage(seq_len=32768, window=7, lr_peak=1.5),
    ]
    table = StageTable(rows=rows, columns={"seq_len": [64, 128]})
    assert [(r.seq_len, r.window, r.lr_peak) for r in table.rows] == [(64, 3, 1.0), (128, 7, 1.5)]
    assert table.columns == {}


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"seq_length": [1, 2]}, "train.stages.columns.seq_length is not a column"),
        ({"seq_len": [64]}, r"train.stages.columns.seq_len has 1 values for the \d rows"),
    ],
)
def test_stage_columns_refuse_a_wrong_name_or_length(columns: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StageTable(rows=[Stage(seq_len=8), Stage(seq_len=16)], columns=columns)
    with pytest.raises(Exception, match=message):  # through the composed config too
        to_config(compose_config([
            "experiment=record_2025_11_29", "run_dir=.",
            *(f"+train.stages.columns.{name}={values}" for name, values in columns.items()),
        ]))  # fmt: skip


@pytest.mark.parametrize("case", ["default", *RECORDS])
def test_bitwise_spells_a_toy_out_key_by_key(case: str) -> None:
    """scripts/bitwise.py gives the other commit the toy as plain overrides: they compose, in
    this tree, to the config `size=toy` composes to."""
    from scripts.bitwise import COMMON, spelled_out

    sized = [*COMMON, *([] if case == "default" else [f"experiment={case}"]), "size=toy"]
    spelled = spelled_out(sized)
    assert not any(w.startswith(("size=", "preset_size")) for w in spelled)
    assert config_leaves(spelled) == config_leaves(sized)


def test_a_row_override_the_overlays_columns_would_overwrite_is_refused() -> None:
    """`size=toy` sets record #46's seq_len column whole; a row's seq_len on the command line
    would be overwritten when the table is built, so it is refused naming the column to set.
    Another column of a row still takes the override; the column itself does too."""
    base = ["experiment=record_2025_11_29", "size=toy", "run_dir=."]
    with pytest.raises(ValueError, match=r"train.stages.rows.0.seq_len: .*columns.seq_len=\["):
        compose_config([*base, "train.stages.rows.0.seq_len=64"])
    with pytest.raises(ValueError, match=r"train\.stages\.rows\.1: "):
        compose_config([*base, "train.stages.rows.1={seq_len:64}"])
    rows = to_config(compose_config([*base, "train.stages.rows.0.window=2"])).train.stages.rows
    assert [(r.seq_len, r.window) for r in rows] == [(128, 2), (256, 7), (512, 11)]
    conf = to_config(compose_config([*base, "train.stages.columns.seq_len=[64,128,512]"]))
    assert [r.seq_len for r in conf.train.stages.rows] == [64, 128, 512]


def test_a_size_without_the_experiments_overlay_is_said(tmp_path: Path) -> None:
    """A size below full names the overlay an experiment lacks (only the shared part
    applies), and says nothing where the overlay exists or no size is asked; on the command
    line the warning comes before the run (trainer/cli/main.py)."""
    from trainer.cli.sizes import size_without_overlay

    said = size_without_overlay(["experiment=smoke", "size=gpu_toy"], CONF_DIR)
    assert said is not None and "conf/preset_size/gpu_toy/smoke.yaml" in said
    for quiet in (["experiment=record_2024_11_06", "size=gpu_toy"], ["experiment=smoke"],
                  ["size=toy"], ["experiment=smoke", "size=toy,full"]):  # fmt: skip
        assert size_without_overlay(quiet, CONF_DIR) is None, quiet
    # A user's own experiment: a conf directory with the experiment and no overlay
    (tmp_path / "preset_size" / "toy").mkdir(parents=True)
    mine = size_without_overlay(["+experiment=mine", "size=toy"], tmp_path)
    assert mine is not None and "size=toy: experiment=mine has no" in mine
