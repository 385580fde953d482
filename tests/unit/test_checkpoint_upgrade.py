"""A save of naming 1 (before the model's parts: `bigram_embed`, `xsa_alphas`, …) is read under
today's names (trainer/checkpoint/upgrade.py). The names of naming 1 below are written out as that
code named them, for record_2025_01_26, record_2025_11_29 (unpacked) and record_2026_07_17 at toy
size, so the test does not read the upgrade table to know them; `scripts/bitwise.py` loads real
naming-1 saves."""

import pytest
import torch

from model.gpt import GPT
from tests.helpers import compose_config
from trainer.checkpoint.upgrade import (
    NAMES,
    saved_keys,
    upgrade_config,
    upgrade_flat,
    upgrade_parts,
)
from trainer.config import to_config

D = ["experiment=record_2026_07_17", "model.n_embd=48", "model.n_head=6",
     "model.bigram.rows=256", "model.bigram.dim=8", "model.residual.mudd_hidden=4",
     "model.attention.window_block=16"]  # fmt: skip
C = ["experiment=record_2025_11_29", "model.n_layer=4", "model.n_head=2", "model.n_embd=64",
     "model.residual.skips=[[1,2]]", "model.residual.backout_layer=2",
     "model.attention.window_block=16", "model.numerics.packed_scalars=false"]  # fmt: skip
B = ["experiment=record_2025_01_26", "model.n_layer=4", "model.n_head=2", "model.n_embd=64"]
# The state_dict keys outside the blocks as naming 1 wrote them (the blocks kept theirs).
NAMING_1 = {
    "D": ["scalars", "resid_lambdas", "post_lambdas", "xsa_alphas", "value_gates", "x0_lambdas",
          "mudd_w1", "mudd_w2", "mudd_b2", "bigram_lambdas", "bigram_signs", "embed.weight",
          "value_embeds.0.weight", "value_embeds.1.weight", "value_embeds.2.weight",
          "value_embeds.3.weight", "value_embeds.4.weight", "skip_token_gate.weight",
          "lm_head.weight", "smear_gate.weight", "bigram_embed.weight"],
    "C": ["skip_gate", "smear_lambda", "backout_lambda", "embed.weight", "value_embeds.2.weight",
          "lm_head.weight", "smear_gate.weight"],
    "B": ["skip_weights", "embed.weight", "value_embeds.0.weight", "value_embeds.2.weight",
          "lm_head.weight"],
}  # fmt: skip
OVERRIDES = {"D": D, "C": C, "B": B}


def model_of(case: str) -> GPT:
    conf = to_config(compose_config([*OVERRIDES[case], "run_dir=."]))
    torch.manual_seed(0)
    return GPT(conf.model, conf.train.stages)


def naming_1_state(model: GPT, case: str) -> dict[str, torch.Tensor]:
    """The model's state as naming 1 saved it: its blocks' keys, and the listed others, each
    holding the tensor today's model holds under its new name (`_today`)."""
    state = model.state_dict()
    blocks = {k: v for k, v in state.items() if k.startswith("blocks.")}
    others = {k: v for k, v in state.items() if not k.startswith("blocks.")}
    old = NAMING_1[case]
    assert len(old) == len(others), (sorted(old), sorted(others))
    return blocks | {name: others[_today(name, others)] for name in old}


def _today(old: str, others: dict[str, torch.Tensor]) -> str:
    """Today's key of a naming-1 key, by the part it belongs to (written here, not read from
    the upgrade table)."""
    parts = {"scalars": "scalars.packed", "skip_gate": "scalars.skip_gate",
             "smear_lambda": "scalars.smear_lambda", "backout_lambda": "scalars.backout_lambda",
             "resid_lambdas": "sublayer_scales.resid_lambdas",
             "post_lambdas": "sublayer_scales.post_lambdas", "xsa_alphas": "xsa.alphas",
             "value_gates": "value_gates.weight", "x0_lambdas": "x0_injection.lambdas",
             "mudd_w1": "mudd.w1", "mudd_w2": "mudd.w2", "mudd_b2": "mudd.b2",
             "bigram_lambdas": "bigram.lambdas", "bigram_signs": "bigram.signs",
             "bigram_embed.weight": "bigram.embed.weight",
             "skip_token_gate.weight": "skips.token_gate.weight",
             "skip_weights": "skips.weights"}  # fmt: skip
    name = parts.get(old, old)
    assert name in others, (old, name)
    return name


@pytest.mark.parametrize("case", ["B", "C", "D"])
def test_a_naming_1_save_loads_into_todays_model(case: str) -> None:
    model = model_of(case)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p.float()).to(p.dtype))
    old = naming_1_state(model, case)
    fresh = model_of(case)
    parts = upgrade_parts({"model": old, "optimizers": []}, {})  # no "names": naming 1
    fresh.load_state_dict(parts["model"])  # strict: every key placed, none left over
    for key, value in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    # Control: the same state read as today's naming does not load.
    with pytest.raises(RuntimeError, match="Missing key"):
        fresh.load_state_dict(upgrade_parts({"model": old}, {"names": NAMES})["model"])


def test_the_optimizers_param_names_and_a_sharded_saves_keys() -> None:
    saved = {"state": {}, "param_groups": [{"param_names": ["bigram_embed.weight", "xsa_alphas",
                                                            "blocks.0.attn.qkvo"]}]}  # fmt: skip
    groups = upgrade_parts({"optimizers": [saved]}, {"names": 1})["optimizers"][0]
    assert groups["param_groups"][0]["param_names"] == [
        "bigram.embed.weight", "xsa.alphas", "blocks.0.attn.qkvo"
    ]  # fmt: skip
    flat = {"adam/bigram_lambdas/exp_avg": 1, "muon/blocks.1.mlp.fc.weight/momentum_buffer": 2}
    assert upgrade_flat(flat, {}, flat=True) == {
        "adam/bigram.lambdas/exp_avg": 1, "muon/blocks.1.mlp.fc.weight/momentum_buffer": 2
    }  # fmt: skip
    assert upgrade_flat({"scalars": 3}, {}, flat=False) == {"scalars.packed": 3}
    target = {"model/scalars.packed": 0, "optim/adam/value_gates.weight/exp_avg": 1, "x": 2}
    assert saved_keys(target, {"names": 1}, "model/", "optim/") == {
        "model/scalars": 0, "optim/adam/value_gates/exp_avg": 1, "x": 2
    }  # fmt: skip
    assert saved_keys(target, {"names": NAMES}, "model/", "optim/") == target  # today's: as is


def test_a_naming_1_config_names_todays_parameters() -> None:
    """record_2026_07_17's saved optimizer tables of naming 1 (as its preset wrote them) read under
    today's names, its two bigram rows moved to the part's section; a naming-2 save as is."""
    old = {
        "optim": {
            "roles": {"skip_token_gate.weight": "scalar", "smear_gate.weight": "scalar"},
            "lr_mul": {"*mlp.proj*": 2.0},
            "adamw": {"table": {
                "scalars": {"lr_mul": 5}, "bigram_embed.weight": {"lr_mul": 75, "wd_mul": 5},
                "bigram_lambdas": {"wd_mul": 0}, "mudd_w[12]": {"lr_mul": 0.25},
                "xsa_alphas": {"wd_mul": 0}, "value_embeds.*": {"lr_mul": 75}}},
        },
        "model": {"embed": {"bigram_rows": 754560}},
    }  # fmt: skip
    new = upgrade_config(old, {})
    assert new["optim"]["roles"] == {
        "skips.token_gate.weight": "scalar",
        "smear_gate.weight": "scalar",
    }
    assert new["optim"]["lr_mul"] == {"*mlp.proj*": 2.0}
    assert new["optim"]["adamw"]["table"] == {
        "scalars.packed": {"lr_mul": 5}, "mudd.w[12]": {"lr_mul": 0.25},
        "xsa.alphas": {"wd_mul": 0}, "value_embeds.*": {"lr_mul": 75}}  # fmt: skip
    assert new["model"]["bigram"]["optim"] == {"embed": {"lr_mul": 75, "wd_mul": 5},
                                               "lambdas": {"wd_mul": 0}}  # fmt: skip
    assert old["optim"]["roles"] == {
        "skip_token_gate.weight": "scalar",
        "smear_gate.weight": "scalar",
    }
    assert upgrade_config(old, {"names": NAMES}) is old  # today's naming: as saved
