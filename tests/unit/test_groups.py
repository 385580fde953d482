"""Parameter partition into optimizer groups, and the optimizers built from it."""

import pytest
import torch
from torch import nn

from optim import Muon, build_optimizer, partition_params
from optim.config import OptimConfig
from optim.muon.ns_dtype import resolve_ns_dtype


class StandInGPT(nn.Module):
    """The GPT's parameter layout (names, module types, shapes) without its forward pass."""

    def __init__(self, n_layer: int = 2, d: int = 16, vocab: int = 40) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList()
        for _ in range(n_layer):
            block = nn.Module()
            block.attn = nn.Module()
            for name in ("q", "k", "v", "o"):
                setattr(block.attn, name, nn.Linear(d, d, bias=False))
            block.mlp = nn.Module()
            block.mlp.fc = nn.Linear(d, 4 * d, bias=False)
            block.mlp.proj = nn.Linear(4 * d, d, bias=False)
            self.blocks.append(block)
        self.lm_head = nn.Linear(d, vocab, bias=False)


HIDDEN = [
    f"blocks.{i}.{name}.weight"
    for i in range(2)
    for name in ("attn.q", "attn.k", "attn.v", "attn.o", "mlp.fc", "mlp.proj")
]


def names(groups):
    return {group: [name for name, _ in params] for group, params in groups.items()}


def test_gpt_layout_muon_adamw():
    model = StandInGPT()
    groups = names(partition_params(model, "muon_adamw"))
    assert groups == {
        "muon": HIDDEN,
        "embed": ["embed.weight"],
        "head": ["lm_head.weight"],
        "scalar": [],
    }


def test_adamw_puts_hidden_matrices_in_their_own_group():
    groups = names(partition_params(StandInGPT(), "adamw"))
    assert groups == {
        "hidden": HIDDEN,
        "embed": ["embed.weight"],
        "head": ["lm_head.weight"],
        "scalar": [],
    }


def test_every_parameter_lands_in_exactly_one_group():
    model = StandInGPT()
    model.gain = nn.Parameter(torch.ones(16))
    model.blocks[0].mlp.fc.bias = nn.Parameter(torch.zeros(64))
    for optimizer_name in ("muon_adamw", "adamw"):
        groups = partition_params(model, optimizer_name)
        placed = [id(p) for params in groups.values() for _, p in params]
        assert sorted(placed) == sorted(id(p) for p in model.parameters())


def test_biases_and_scalars_go_to_scalar_group():
    model = StandInGPT()
    model.lm_head.bias = nn.Parameter(torch.zeros(40))
    model.blocks[1].attn.lam = nn.Parameter(torch.tensor(0.5))
    model.skip_weights = nn.Parameter(torch.ones(2))
    groups = names(partition_params(model, "muon_adamw"))
    assert groups["scalar"] == ["skip_weights", "blocks.1.attn.lam", "lm_head.bias"]
    assert groups["head"] == ["lm_head.weight"] and groups["muon"] == HIDDEN


def test_frozen_parameters_are_left_out():
    model = StandInGPT()
    model.embed.weight.requires_grad_(False)
    assert partition_params(model, "muon_adamw")["embed"] == []


def test_tied_weights_are_rejected():
    model = StandInGPT()
    model.lm_head.weight = model.embed.weight
    with pytest.raises(ValueError, match=r"'lm_head.weight' is the same tensor as 'embed.weight'"):
        partition_params(model, "muon_adamw")


def test_parameter_of_no_group_is_named():
    model = StandInGPT()
    model.blocks[0].attn.qkv = nn.Parameter(torch.zeros(3, 16, 16))
    with pytest.raises(ValueError, match=r"blocks\.0\.attn\.qkv \(shape \(3, 16, 16\)\)"):
        partition_params(model, "muon_adamw")


def test_unknown_optimizer_name():
    with pytest.raises(ValueError, match="optimizer_name must be one of"):
        partition_params(StandInGPT(), "sgd")


# --- build_optimizer ---------------------------------------------------------------------------

CPU = torch.device("cpu")


def build(model: nn.Module, cfg: OptimConfig):
    return build_optimizer(model, cfg, device=CPU)


def test_build_muon_adamw():
    model = StandInGPT()
    model.gain = nn.Parameter(torch.ones(16))
    cfg = OptimConfig()
    cfg.muon.lr_scale = "match_rms_adamw"
    opt = build(model, cfg)
    muon, adamw = opt.parts
    assert isinstance(muon, Muon) and isinstance(adamw, torch.optim.AdamW)
    (group,) = muon.param_groups
    assert len(group["params"]) == len(HIDDEN)
    assert group["lr"] == group["initial_lr"] == cfg.muon.lr
    assert muon.hp.lr_scale == "match_rms_adamw" and group["momentum"] == cfg.muon.momentum
    by_name = {g["name"]: g for g in adamw.param_groups}
    assert list(by_name) == ["embed", "head", "scalar"]
    a = cfg.adamw
    for name, lr, param in [
        ("embed", a.embed_lr, model.embed.weight),
        ("head", a.head_lr, model.lm_head.weight),
        ("scalar", a.scalar_lr, model.gain),
    ]:
        assert by_name[name]["lr"] == by_name[name]["initial_lr"] == lr
        assert by_name[name]["params"] == [param]
    assert adamw.defaults["betas"] == (a.beta1, a.beta2) and adamw.defaults["fused"] is False
    assert opt.lrs() == {"muon": cfg.muon.lr, "embed": a.embed_lr, "head": a.head_lr,
                         "scalar": a.scalar_lr}  # fmt: skip
    dtype = str(resolve_ns_dtype("auto", CPU)).removeprefix("torch.")
    assert opt.summary == f"muon_adamw (Newton-Schulz in {dtype})"
    assert opt.params() == [*group["params"], model.embed.weight, model.lm_head.weight, model.gain]


def test_build_adamw_only_skips_empty_groups():
    model = StandInGPT()
    cfg = OptimConfig(name="adamw")
    opt = build(model, cfg)
    (adamw,) = opt.parts
    assert isinstance(adamw, torch.optim.AdamW)
    by_name = {g["name"]: g for g in adamw.param_groups}
    assert list(by_name) == ["hidden", "embed", "head"]  # no scalars in this model
    assert by_name["hidden"]["lr"] == cfg.adamw.hidden_lr
    assert len(by_name["hidden"]["params"]) == len(HIDDEN)
    assert opt.summary == "adamw", "no Newton-Schulz to speak of"


def test_built_optimizer_trains():
    torch.manual_seed(0)
    model = StandInGPT()
    opt = build(model, OptimConfig())
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    for n, p in model.named_parameters():
        assert not torch.equal(p, before[n]), n
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
