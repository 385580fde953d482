"""The command line's overrides are checked before Hydra composes them: the typos users type
fail with one message naming the key or option and the nearest valid name."""

import shutil
from pathlib import Path

import pytest

from trainer.cli.overrides import check_command_line, check_overrides, compose_and_validate
from trainer.config import Config

CONF = Path(__file__).resolve().parents[2] / "conf"

BAD = [
    ("train.step=10", r"unknown config key train\.step; did you mean train\.steps or train\.stag"),
    ("optim.muon.lrr=0.1", r"unknown config key optim\.muon\.lrr; did you mean optim\.muon\.lr\?"),
    ("model=tiny2", r"unknown option model=tiny2; did you mean model=tiny\? .*gpt2_124m, .*tiny"),
    ("train.steps=abc", r"train\.steps=abc: .*'abc'.*Integer"),
    ("trian.steps=3", r"unknown config key trian\.steps; did you mean train\.steps\?"),
    ("modle=tiny", r"unknown config key modle; did you mean model\?"),
    ("+train.step=3", r"unknown config key train\.step; did you mean train\.steps or train\.st"),
    ("train.steps", r"cannot read the override 'train\.steps'.*key=value"),
    ("experiment=record_2025_1_26", r"did you mean experiment=record_2025_01_26\?"),
    ("model=tiny,tiny3", r"unknown option model=tiny3"),  # every value of a sweep
    ("train.steps=4,x", r"train\.steps=4,x: .*'x'"),
    ("optim.muon.momentum=high", r"optim\.muon\.momentum=high: .*Float"),
    ("train.steps=12.0", r"train\.steps=12\.0: .*'float'.*Integer"),  # as Hydra: no float
    ("train.compile_mode.x=1", r"unknown config key train\.compile_mode\.x"),
    # No near name in the group: the keys of that name elsewhere, and the group's own keys.
    ("train.lr=0.1", r"train\.lr; did you mean optim\.muon\.lr, optim\.adamw\.embed_lr, "
     r"optim\.adamw\.head_lr, .*\(the keys of train, the fields of trainer\.config\.TrainConfig: "
     r"steps, batch_size, "),
    ("train.muon.lr=0.1", r"train\.muon\.lr; did you mean optim\.muon\.lr\? \(the keys of train"),
    ("data.fault.rank=1", r"data\.fault\.rank; did you mean train\.fault\.rank\?"),
    ("logging.mode=offline", r"logging\.mode; did you mean logging\.wandb\.mode\? .*: wandb\)$"),
    ("launcher.foo=1", r"launcher is a config group with no keys, chosen as launcher=NAME"),
    # A row of the stage table, by index: its columns are Stage's
    ("train.stages.rows.0.sequence=3", r"rows\.0\.sequence; did you mean train\.stages\.rows"),
    ("train.stages.rows.x=3", r"train\.stages\.rows is a list of rows, named by index"),
    ("train.stages.rows.0.seq_len=abc", r"rows\.0\.seq_len=abc: .*'abc'.*Integer"),
    ("train.stages.rows.1={window:3,junk:1}", r"Key 'junk' not in 'Stage'"),
]  # fmt: skip


@pytest.mark.parametrize(("override", "message"), BAD)
def test_a_bad_override_names_itself(override: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        check_overrides([override], CONF, Config)
    assert "\n" not in str(e.value)


GOOD = [
    "train.steps=10",
    "model=gpt2_124m",
    "experiment=null",
    "optim.muon.lr=0.01,0.02",  # a multirun sweep
    "optim.muon.lr=interval(0.01,0.1)",  # an Optuna search space: the sweeper's to check
    "train.steps=${oc.env:STEPS,5}",  # an interpolation resolves later
    "~train.seed",
    "hydra.run.dir=/tmp/x",
    "hydra/job_logging=ranked",
    "train.autocast=none",  # a choice checked later, by the group's validate()
    "model.n_layer=2",
    "+optim.lr_mul.h=2",  # a free-form mapping: any key
    "model=glob(*)",  # Hydra matches a glob against the options
]


@pytest.mark.parametrize("override", GOOD)
def test_what_hydra_accepts_passes(override: str) -> None:
    check_overrides([override], CONF, Config)


def test_flags_are_hydras_and_another_config_is_not_checked() -> None:
    check_command_line(["-m", "train.steps=3,4"], CONF, Config)  # a sweep: each job checks
    check_command_line(["train.steps=3", "--cfg", "job"], CONF, Config)
    check_command_line(["--config-name", "other", "anything.at=all"], CONF, Config)
    with pytest.raises(ValueError, match=r"train\.step;"):
        check_command_line(["-m", "train.step=3"], CONF, Config)


COMMANDS = [
    (["-m", "seed=0,1", "--cfg", "hydra"], r"^-m \(run a sweep\) and --cfg hydra .* one per "
     r"launch; for the sweep's first job: python train\.py seed=0 --cfg hydra$"),
    (["--multi", "--cfg", "job"], r"without -m: python train\.py --cfg job$"),
    (["-m", "model=glob(*)", "--info"], r"--info .*; drop -m and give each swept key one value$"),
    (["--cfg", "job", "--info"], r"^--cfg job \(.*\) and --info \(.*\) .*: give one$"),
    (["--resolve"], r"^--resolve resolves what --cfg prints: add --cfg job"),
    (["seed=0,1", "--hydra-help"], r"^--hydra-help .* seed=0,1 is a sweep; .* seed=0 --hydra-help"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "message"), COMMANDS)
def test_flags_hydra_refuses_with_a_traceback_name_the_fix(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_command_line(argv, CONF, Config)


def test_a_config_files_error_is_one_line(tmp_path: Path) -> None:
    """An experiment of one's own with a key in the wrong group names it as the command line
    would, and the file; Hydra's own composition errors come as one line too."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text("# @package _global_\ntrain:\n  lr: 0.1\n")
    with pytest.raises(ValueError, match=r"train\.lr; did you mean optim\.muon\.lr.*") as e:
        compose_and_validate(["experiment=mine"], conf)
    assert str(e.value).endswith(f", in the config file {conf / 'experiment' / 'mine.yaml'}")
    with pytest.raises(ValueError, match=r"^Could not override 'hydra\.job\.x'\. To append"):
        compose_and_validate(["hydra.job.x=1"], CONF)


# Record #89's stage table has three rows; train.stages.rows.5 is past its end.
PAST_THE_END = ["experiment=record_2026_07_17", "data=sample", "train.stages.rows.5.seq_len=128"]
NO_ROW_5 = (
    "cannot set train.stages.rows.5.seq_len=128: train.stages.rows has 3 rows (0..2); to add "
    "rows, give the whole list: 'train.stages.rows=[{...}, ...]'"
)


@pytest.mark.parametrize("command", [[], ["--cfg", "job"], ["--info"]], ids=["run", "cfg", "info"])
def test_a_row_past_the_end_names_the_rows_there_are(command: list[str]) -> None:
    """Before Hydra composes, in one line: a run and the commands that show its config."""
    with pytest.raises(ValueError) as e:
        check_command_line([*PAST_THE_END, *command], CONF, Config)
    assert str(e.value) == NO_ROW_5


def test_the_row_count_is_the_tables_as_overridden() -> None:
    """The rows the other overrides leave: none in the default config, one once replaced."""
    with pytest.raises(ValueError, match=r"^cannot set train\.stages\.rows\.0\.seq_len=8: "
                       r"train\.stages\.rows has no rows; to add rows"):  # fmt: skip
        compose_and_validate(["train.stages.rows.0.seq_len=8"], CONF)  # the default: no table
    with pytest.raises(ValueError, match=r"\.rows\.2={seq_len: 8}: train\.stages\.rows has 1 "
                       r"row \(0\); to add rows"):  # fmt: skip
        compose_and_validate(
            ["train.stages.rows=[{seq_len: 16}]", "train.stages.rows.2={seq_len: 8}"], CONF
        )
