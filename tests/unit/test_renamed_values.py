"""Option values are named by what they compute: each value once named after a record has one
name now, and wherever the old one can still arrive (a command line, a config file, a
checkpoint's saved config, Python code) it either reads as the new value or fails with one
line naming it."""

import logging
import shutil
from dataclasses import asdict, fields
from pathlib import Path

import pytest

from model.config import HeadConfig, ModelConfig, NumericsConfig, update
from model.config.renamed import RENAMED_VALUES as MODEL_RENAMED
from optim.config import MuonConfig
from optim.renamed import RENAMED_VALUES as OPTIM_RENAMED
from tests.helpers import compose_config
from trainer.checkpoint.files import Loaded
from trainer.checkpoint.resume_rules import check_config, upgrade_saved
from trainer.checkpoint.upgrade import NAMES
from trainer.cli.overrides import check_command_line, compose_and_validate
from trainer.config import Config, to_config
from trainer.config_checks import RENAMED_VALUES

CONF = Path(__file__).resolve().parents[2] / "conf"
# Every old value as (dotted key, old, new)
OLD = [(key, old, new) for key, table in RENAMED_VALUES.items() for old, new in table.items()]


def choices(key: str) -> tuple[str, ...]:
    """The choices the schema lists for dotted `key`."""
    node, *path, leaf = key.split(".")
    cls = Config
    for name in [node, *path]:
        cls = {f.name: f for f in fields(cls)}[name].default_factory
    return {f.name: f for f in fields(cls)}[leaf].metadata["choices"]


def one_line(key: str, old: str, new: str) -> str:
    return rf"^{key}={old} is now {key}={new} \(options are named by what they compute\)$"


def test_each_old_value_has_one_new_name_among_the_choices() -> None:
    assert set(RENAMED_VALUES) == {f"model.{k}" for k in MODEL_RENAMED} | {
        f"optim.{k}" for k in OPTIM_RENAMED
    }
    for key, table in RENAMED_VALUES.items():
        allowed = choices(key)
        assert set(table.values()) <= set(allowed), key
        assert not set(table) & set(allowed), key  # no old name is still a choice
        assert len(set(table.values())) == len(table), key  # no two old names share a new one
        assert not any(v.startswith("record_") for v in allowed), key


def test_the_defaults_compute_what_they_did() -> None:
    num = NumericsConfig()
    assert (num.fp8_scales, num.scalars_layout) == ("pow2", "mixes")
    assert MODEL_RENAMED["numerics.fp8_scales"]["record_2025_01"] == "pow2"
    assert MODEL_RENAMED["numerics.scalars_layout"]["record_2025_11"] == "mixes"
    assert (HeadConfig().loss, MuonConfig().normuon_form) == ("auto", "fp32")


@pytest.mark.parametrize(("key", "old", "new"), OLD)
def test_an_old_value_on_the_command_line_names_the_new_one(key: str, old: str, new: str) -> None:
    with pytest.raises(ValueError, match=one_line(key, old, new)) as e:
        check_command_line([f"{key}={old}"], CONF, Config)
    assert "\n" not in str(e.value)


def test_an_old_value_in_a_config_file_names_the_new_one(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\noptim:\n  muon:\n    normuon_form: record_2025_11\n"
    )
    key = "optim.muon.normuon_form"
    with pytest.raises(ValueError, match=one_line(key, "record_2025_11", "o_dtype")):
        compose_and_validate(["experiment=mine"], conf)


@pytest.mark.parametrize(("key", "old", "new"), OLD)
def test_python_callers_get_the_new_name(key: str, old: str, new: str) -> None:
    group, rest = key.split(".", 1)
    with pytest.raises(ValueError, match=one_line(key, old, new)):
        to_config({group: {rest.split(".")[0]: {rest.split(".")[1]: old}}})
    conf = Config()
    setattr(getattr(getattr(conf, group), rest.split(".")[0]), rest.split(".")[1], old)
    with pytest.raises(ValueError, match=one_line(key, old, new)):
        conf.validate()
    if group == "model":  # the model's own validation (GPT(cfg) runs it)
        with pytest.raises(ValueError, match=one_line(key, old, new)):
            update(ModelConfig(), {rest: old}).validate()
    else:  # a standalone Muon validates its settings
        with pytest.raises(ValueError, match=one_line(key, old, new)):
            MuonConfig(**{rest.split(".")[1]: old}).validate()


def test_a_group_alone_names_the_new_value() -> None:
    with pytest.raises(ValueError, match=one_line("model.head.loss", "record_2026_07",
                                                  "sigmoid_e5m2_grad")):  # fmt: skip
        HeadConfig(loss="record_2026_07").validate()
    with pytest.raises(ValueError, match=one_line("model.numerics.fp8_scales", "record_2025_11",
                                                  "sqrt_d_over_448")):  # fmt: skip
        NumericsConfig(fp8_scales="record_2025_11").validate()
    with pytest.raises(ValueError, match=r"fp8_scales must be one of pow2 \| sqrt_d_over_448"):
        to_config({"model": {"numerics": {"fp8_scales": "record_2025_12"}}})  # not an old name


def saved_with_old_values(conf: Config) -> dict:
    """`conf` as a checkpoint from before the renaming saved it: every renamed option at the
    old name of the value it has."""
    saved = asdict(conf)
    for key, table in RENAMED_VALUES.items():
        *path, leaf = key.split(".")
        node = saved
        for name in path:
            node = node[name]
        node[leaf] = {new: old for old, new in table.items()}.get(node[leaf], node[leaf])
    return saved


@pytest.mark.parametrize("preset", ["record_2025_11_29", "record_2026_07_17"])
def test_a_checkpoint_saved_with_old_values_resumes(
    preset: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A saved config with the old values reads as today's (`upgrade_saved`), so a run of the
    same preset sees no difference: no refusal and no warning."""
    conf = to_config(compose_config([f"experiment={preset}", "run_dir=."]))
    saved = saved_with_old_values(conf)
    assert saved != asdict(conf)  # the preset sets some of the renamed options
    assert upgrade_saved(saved) == asdict(conf)
    # today's parameter names (the values alone are old): naming 2 (trainer/checkpoint/upgrade.py)
    loaded = Loaded(path=Path("ckpt"), meta={"config": saved, "names": NAMES}, parts={})
    with caplog.at_level(logging.WARNING, logger="train"):
        check_config(loaded, conf, warn=True)
    assert not caplog.records
