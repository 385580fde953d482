"""The model's config in groups: every key of the former flat schema has one place, and
wherever an old key can still arrive (a command line, a config file, a checkpoint's saved
config, Python code) it either reads as its new key or fails with one line naming it."""

import shutil
from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest

from model.config import ModelConfig, ResidualConfig, update
from model.config.moved import MOVED, RESHAPED, TO_PARTS
from stages.moved import FLAT
from trainer.checkpoint.resume_rules import upgrade_saved
from trainer.cli.overrides import check_overrides, compose_and_validate
from trainer.config import Config, to_config

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ("attention", "embed", "residual", "mlp", "head", "numerics", "bigram")
# The flat schema's fields that stayed at the top, and the fields added since.
KEPT = {"n_layer", "n_head", "n_embd", "vocab_size", "init_std", "gate_channels", "compile",
        "compile_backend"}  # fmt: skip
ADDED = {"residual.sublayer_scales", "residual.resid_init", "residual.post_init", "attention.xsa",
         "head.softcap_shift", "head.softcap_divisor", "attention.key_offset",
         "residual.skip_per_token", "residual.attn_input_layer",
         "residual.x0_after_attention", "embed.value_gate", "embed.value_std",
         "attention.weight_lambdas", "attention.out_init", "numerics.scalars_layout",
         "numerics.bf16_matrices", "head.init_std", "embed.tied_init",
         "mlp.proj_in_out",
         "residual.mudd", "residual.mudd_hidden",
         "attention.paired",
         "bigram.rows", "bigram.dim", "bigram.signs", "bigram.position1",
         "bigram.lambda_init", "bigram.in_x0",
         *(f"bigram.optim.{p}.{k}" for p in ("embed", "lambdas")
           for k in ("lr_mul", "beta1", "beta2", "wd_mul")),
         "head.mtp",
         "mlp.fp8",
         "mlp.fp8_act_headroom", "mlp.fp8_weight_headroom", "mlp.fp8_bootstrap",
         "attention.init_std", "attention.yarn_max_window", "embed.value_gate_input",
         "embed.second_table", "residual.x0_lambdas",
         "attention.max_segments", "head.loss_kernel", "mlp.fp8_kernel",
         "mlp.experts", "mlp.top_k", "mlp.expert_hidden", "mlp.balance"}  # fmt: skip


def leaves(cls: type, prefix: str = "") -> set[str]:
    """Every leaf field of a config dataclass, dotted."""
    out = set()
    for f in fields(cls):
        if is_dataclass(f.default_factory):
            out |= leaves(f.default_factory, f"{prefix}{f.name}.")
        else:
            out.add(f"{prefix}{f.name}")
    return out


def test_every_flat_key_has_exactly_one_new_place() -> None:
    """Each flat key is a key of a group, or (the window's keys by phase) went on into the
    stage table (stages/moved.py, tests/unit/test_stages.py)."""
    grouped = leaves(ModelConfig)
    # the one gated skip's two keys went on into the list of skips
    placed = {RESHAPED.get(v, v) for v in MOVED.values()}
    assert placed <= grouped, placed - grouped
    assert not {k.removeprefix("model.") for k in FLAT} & (set(MOVED) | KEPT)
    assert len(set(MOVED.values())) == len(MOVED)  # no two old keys share a place
    assert grouped == placed | KEPT | ADDED  # nothing lost, nothing unnamed
    assert not set(MOVED) & KEPT
    assert {f.name for f in fields(ModelConfig)} == KEPT | set(GROUPS)


@pytest.mark.parametrize(("old", "value"), [("window", "LS"), ("dtype", "bf16"),
                                          ("loss", "plain"), ("fp8_head", "true"),
                                          ("backout_layer", "1")])  # fmt: skip
def test_a_flat_override_names_its_new_key(old: str, value: str) -> None:
    with pytest.raises(ValueError, match=rf"^model\.{old} is now model\.{MOVED[old]}") as e:
        check_overrides([f"model.{old}={value}"], CONF, Config)
    assert "\n" not in str(e.value)
    check_overrides([f"model.{MOVED[old]}={value}"], CONF, Config)  # the new key is taken


def test_a_flat_key_in_a_config_file_names_its_new_key(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nmodel:\n  window_tokens: 128\n  window: LS\n"
    )
    with pytest.raises(ValueError, match=r"model\.\w+ is now model\.attention\.\w+.*config file"):
        compose_and_validate(["experiment=mine"], conf)
    (conf / "experiment" / "mine.yaml").write_text(
        "# @package _global_\nmodel:\n  attention:\n    window_tokens: 128\n    window: LS\n"
    )
    compose_and_validate(["experiment=mine"], conf)  # the grouped form composes


def test_a_saved_flat_config_reads_under_the_new_keys() -> None:
    saved = {"model": {"n_layer": 2, "dtype": "bf16", "window": "LS", "fp8_head": True,
                       "logit_softcap": 15.0, "attention_layers": "AA"},
             "optim": {"schedule": {"window_tokens": 64}}}  # fmt: skip
    model = upgrade_saved(saved)["model"]
    assert model == {"n_layer": 2, "numerics": {"dtype": "bf16"},
                     "attention": {"window": "LS", "layers": "AA", "window_tokens": 64},
                     "head": {"fp8": True, "softcap": 15.0}}  # fmt: skip
    cfg = to_config({"model": model}).model
    assert (cfg.attention.window_tokens, cfg.head.softcap, cfg.numerics.dtype) == (64, 15, "bf16")


def test_python_callers_get_the_new_name() -> None:
    cfg = ModelConfig()
    with pytest.raises(AttributeError, match=r"model\.window is now model\.attention\.window"):
        _ = cfg.window
    with pytest.raises(AttributeError, match=r"model\.loss is now model\.head\.loss"):
        update(cfg, {"loss": "plain"})
    with pytest.raises(AttributeError, match=r"no key 'attention\.windw'"):
        update(cfg, {"attention.windw": "LS"})
    with pytest.raises(AttributeError, match=r"has no attribute 'nonsense'"):
        _ = cfg.nonsense
    assert not hasattr(cfg, "window")  # hasattr still answers, as for any missing attribute


def test_update_copies_and_leaves_the_original() -> None:
    base = ModelConfig()
    changed = update(base, {"attention.window": "LS", "n_layer": 2, "head.softcap": 15.0})
    assert (changed.attention.window, changed.n_layer, changed.head.softcap) == ("LS", 2, 15.0)
    assert (base.attention.window, base.n_layer, base.head.softcap) == ("", 4, 30.0)
    assert changed.embed is not base.embed  # a deep copy: no group is shared


@pytest.mark.parametrize("old", sorted(TO_PARTS))
def test_a_key_moved_to_its_mechanisms_section_names_the_new_one(old: str) -> None:
    """The bigram's keys left model.embed / model.residual for model.bigram: the command line,
    a Python caller and a saved config each meet the new key."""
    new, value = TO_PARTS[old], {"bigram.position1": "token", "bigram.in_x0": "false"}
    with pytest.raises(ValueError, match=rf"^model\.{old} is now model\.{new} \(each mechanism"):
        check_overrides([f"model.{old}=1"], CONF, Config)
    check_overrides([f"model.{new}={value.get(new, '2')}"], CONF, Config)  # the new key is taken
    with pytest.raises(AttributeError, match=rf"model\.{old} is now model\.{new}"):
        update(ModelConfig(), {old: 1})
    group, leaf = old.split(".")
    saved = upgrade_saved({"model": {group: {leaf: 7}}})["model"]
    assert saved["bigram"] == {new.split(".")[1]: 7} and leaf not in saved[group]


@pytest.mark.parametrize("old", ["model.skip_from=1", "model.residual.skip_from=1",
                                 "model.residual.skip_to=2"])  # fmt: skip
def test_the_one_skips_keys_name_the_list_of_skips(old: str) -> None:
    """skip_from / skip_to (flat or grouped) became a pair of model.residual.skips: the command
    line, a Python caller and a saved config each say so, or read it as that pair."""
    with pytest.raises(ValueError, match=r"is now model\.residual\.skips, a list of \[from, to\]"):
        check_overrides([old], CONF, Config)
    check_overrides(["model.residual.skips=[[1,2]]"], CONF, Config)
    with pytest.raises(
        TypeError, match=r"model\.residual\.skip_from is now model\.residual\.skips"
    ):
        ResidualConfig(skip_from=1)
    with pytest.raises(AttributeError, match=r"model\.residual\.skip_to is now"):
        _ = ResidualConfig().skip_to
    saved = {"model": {"residual": {"skip_from": 4, "skip_to": 7}}}
    assert upgrade_saved(saved)["model"]["residual"] == {"skips": [[4, 7]]}
    off = {"model": {"skip_from": -1, "skip_to": -1}}
    assert upgrade_saved(off)["model"]["residual"] == {"skips": []}
