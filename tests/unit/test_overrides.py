"""The command line's overrides are checked before Hydra composes them: the typos users type
fail with one message naming the key or option and the nearest valid name."""

from pathlib import Path

import pytest

from trainer.cli.overrides import check_command_line, check_overrides
from trainer.config import Config

CONF = Path(__file__).resolve().parents[2] / "conf"

BAD = [
    ("train.step=10", r"unknown config key train\.step; did you mean train\.steps\?"),
    ("optim.muon.lrr=0.1", r"unknown config key optim\.muon\.lrr; did you mean optim\.muon\.lr\?"),
    ("model=tiny2", r"unknown option model=tiny2; did you mean model=tiny\? .*gpt2_124m, .*tiny"),
    ("train.steps=abc", r"train\.steps=abc: .*'abc'.*Integer"),
    ("trian.steps=3", r"unknown config key trian\.steps; did you mean train\.steps\?"),
    ("modle=tiny", r"unknown config key modle; did you mean model\?"),
    ("+train.step=3", r"unknown config key train\.step; did you mean train\.steps\?"),
    ("train.steps", r"cannot read the override 'train\.steps'.*key=value"),
    ("experiment=record_2025_1_26", r"did you mean experiment=record_2025_01_26\?"),
    ("model=tiny,tiny3", r"unknown option model=tiny3"),  # every value of a sweep
    ("train.steps=4,x", r"train\.steps=4,x: .*'x'"),
    ("optim.muon.momentum=high", r"optim\.muon\.momentum=high: .*Float"),
    ("train.steps=12.0", r"train\.steps=12\.0: .*'float'.*Integer"),  # as Hydra: no float
    ("train.compile_mode.x=1", r"unknown config key train\.compile_mode\.x"),
]


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
]


@pytest.mark.parametrize("override", GOOD)
def test_what_hydra_accepts_passes(override: str) -> None:
    check_overrides([override], CONF, Config)


def test_flags_are_hydras_and_another_config_is_not_checked() -> None:
    check_command_line(["-m", "train.steps=3,4", "--cfg", "job"], CONF, Config)
    check_command_line(["--config-name", "other", "anything.at=all"], CONF, Config)
    with pytest.raises(ValueError, match=r"train\.step;"):
        check_command_line(["-m", "train.step=3"], CONF, Config)
