"""optim.muon.table: Newton–Schulz settings by parameter name. Each row's matrices step as a
param group of their own, exactly as a standalone Muon with those settings steps them; the
other matrices keep optim.muon's. Rows are checked before any work, naming the row."""

import copy

import pytest
import torch
from torch import nn

from optim import Muon, build_optimizer
from optim.config import OptimConfig
from optim.muon.config import NSRow
from tests.helpers import compose_config
from trainer.config import to_config

CPU = torch.device("cpu")
ROW = {"ns_steps": 2, "ns_coefficients": "polar_express"}


def small_model() -> nn.Module:
    gen = torch.Generator().manual_seed(0)
    model = nn.Module()
    model.embed = nn.Embedding(10, 16)
    model.attn = nn.Linear(16, 16, bias=False)  # square: the row's
    model.mlp = nn.Linear(16, 48, bias=False)  # tall: optim.muon's own settings
    model.lm_head = nn.Linear(16, 10, bias=False)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def config(table: dict) -> OptimConfig:
    cfg = OptimConfig()
    cfg.muon.ns_dtype = "fp32"  # every CPU computes the same bits
    cfg.muon.table = table
    return cfg


def grads(model: nn.Module, steps: int) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(1)
    return [{n: torch.randn(p.shape, generator=gen) for n, p in model.named_parameters()}
            for _ in range(steps)]  # fmt: skip


def alone(weight: torch.Tensor, gs: list[torch.Tensor], cfg: OptimConfig, **ns) -> torch.Tensor:
    """`weight` stepped by a standalone Muon with optim.muon's settings, and `ns` over them."""
    w = nn.Parameter(weight.detach().clone())
    opt = Muon([w], cfg.muon, ns_dtype=torch.float32, table={}, **ns)
    for g in gs:
        w.grad = g.clone()
        opt.step()
    return w.detach()


def test_a_row_steps_its_matrices_with_its_settings_and_the_rest_with_the_defaults() -> None:
    model = small_model()
    start = copy.deepcopy(model)
    cfg = config({"attn.*": ROW})
    opt = build_optimizer(model, cfg, device=CPU)
    groups = [g for part in opt.parts for g in part.param_groups]
    muon = [g for g in groups if g["name"].startswith("muon")]
    assert [(g["name"], g["param_names"]) for g in muon] == [
        ("muon", ["mlp.weight"]),
        ("muon_row0", ["attn.weight"]),
    ]
    assert "optim.muon.table 'attn.*': ns_steps 2, ns_coefficients polar_express" in (
        opt.groups_table
    )
    steps = grads(model, 3)
    for step in steps:
        for n, p in model.named_parameters():
            p.grad = step[n].clone()
        opt.step()
    for name, ns in (("attn", ROW), ("mlp", {})):
        gs = [step[f"{name}.weight"] for step in steps]
        want = alone(getattr(start, name).weight, gs, cfg, **ns)
        assert torch.equal(getattr(model, name).weight.detach(), want), name
    # the row mattered: optim.muon's own settings step the attention otherwise
    default = alone(start.attn.weight, [s["attn.weight"] for s in steps], cfg)
    assert not torch.equal(model.attn.weight.detach(), default)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"nothing.*": ROW}, r"optim\.muon\.table: \['nothing\.\*'\] match no Muon parameter"),
        ({"attn.*": ROW, "*.weight": ROW}, r"optim\.muon\.table: 'attn\.weight' matches"),
        ({"attn.*": {}}, r"optim\.muon\.table\['attn\.\*'\] sets nothing"),
        ({"attn.*": {"ns_steps": 0}}, r"optim\.muon\.table\['attn\.\*'\]: optim\.muon\.ns_steps"),
        ({"attn.*": {"ns_coefficients": "custom"}}, r"table\['attn\.\*'\]: .*needs optim\.muon"),
    ],
)
def test_bad_rows_are_named_before_any_step(table: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        cfg = config(table)
        cfg.muon.validate()
        build_optimizer(small_model(), cfg, device=CPU)


def test_the_command_line_gives_typed_rows() -> None:
    cfg = to_config(compose_config(["run_dir=.", "+optim.muon.table={*.attn.*: {ns_steps: 6}}"]))
    assert cfg.optim.muon.rows() == {"*.attn.*": NSRow(ns_steps=6)}
    assert cfg.optim.muon.rows()["*.attn.*"].given() == {"ns_steps": 6}
