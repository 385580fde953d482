"""experiment=record_2026_07_17 against docs/records.md D.3 (NorMuon, the tie) and D.1 (the model
it composes): what the preset resolves to, key by key. Its Adam table, schedules and batches
are held by test_record_2026_07_17_adam.py and test_record_2026_07_17_schedule.py; the model by
test_record_2026_07_17_model.py."""

import shlex
from fnmatch import fnmatch

import torch
from omegaconf import OmegaConf

from model import GPT
from optim.muon.update import lr_scale_factor
from tests.helpers import CONF_DIR, compose_config
from trainer.config import to_config

ETA = 0.023


def preset():
    return to_config(compose_config(["experiment=record_2026_07_17", "run_dir=."]))


def test_normuon_and_the_tie_are_record_2026_07_17() -> None:
    conf = preset()
    muon, optim = conf.optim.muon, conf.optim
    assert (muon.lr, muon.normuon_beta2, muon.weight_decay) == (ETA, 0.9, 1.2)
    assert (muon.qk_split, muon.normuon_axis, muon.normuon_form, muon.master_weights) == (
        "head_pairs", "shape", "fp32_mean_squares", "fp32_truncated",
    )  # fmt: skip
    assert (muon.ns_coefficients, muon.eps, muon.weight_decay_form) == (
        "polar_express", 1e-6, "cautious",
    )  # fmt: skip
    warm = (muon.momentum_warmup_start, muon.momentum, muon.momentum_warmup_steps)
    assert warm == (0.85, 0.95, 300)
    assert optim.tie_embed_head_until == 921 and conf.model.embed.tied_init
    assert conf.model.numerics.bf16_matrices and conf.model.mlp.proj_in_out


def test_each_normuon_matrix_takes_its_factor_m() -> None:
    """D.3: m = 1 for the Q/K head-pair and V/O matrices, 2 for C_fc, 4 for C_proj: the shape
    factor times optim.lr_mul, at the record's shapes."""
    conf = preset()
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    for name, p in model.named_parameters():
        if "qkvo" in name:
            blocks = [(2 * conf.model.head_dim, p.shape[-1])] * 2 + [tuple(p.shape[-2:])] * 2
        elif ".mlp." in name:
            blocks = [tuple(p.shape)]
        else:
            continue
        mul = next((f for pat, f in conf.optim.lr_mul.items() if fnmatch(name, pat)), 1.0)
        factors = {lr_scale_factor(shape, conf.optim.muon.lr_scale) * mul for shape in blocks}
        want = {1.0} if "qkvo" in name else {2.0} if "mlp.fc" in name else {4.0}
        assert factors == want, name


def test_the_preset_composes_the_record_2026_07_17_model() -> None:
    got = OmegaConf.to_container(compose_config(["experiment=record_2026_07_17"]).model)
    want = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "model" / "record_2026_07.yaml"))
    for group, values in want.items():
        assert (
            got[group] == values
            if not isinstance(values, dict)
            else all(got[group][k] == v for k, v in values.items())
        ), group


def test_the_readmes_toy_command_composes() -> None:
    """README.md's record_2026_07_17 toy command is a valid run (its run:
    tests/e2e/test_records.py's record_2026_07_17 toy, a smaller one)."""
    line = next(x for x in (CONF_DIR.parent / "README.md").read_text().splitlines()
                if x.startswith("python train.py experiment=record_2026_07_17"))  # fmt: skip
    conf = to_config(compose_config([*shlex.split(line)[2:], "run_dir=."]))  # as a shell reads it
    assert conf.optim.tie_embed_head_until < conf.train.steps - conf.train.extension_steps
    assert conf.data.source == "sample"
