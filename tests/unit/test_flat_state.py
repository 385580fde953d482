"""optim/flat_state.py: optimizer state by name, and the bridge to positional state dicts."""

import pytest
import torch
from torch import nn

from optim import build_optimizer
from optim import flat_state as flat
from optim.config import OptimConfig

CPU = torch.device("cpu")


def model_and_optimizer() -> tuple[nn.Module, object]:
    torch.manual_seed(0)
    model = nn.Module()
    model.embed = nn.Embedding(10, 8)
    model.hidden = nn.Linear(8, 8, bias=False)
    model.lm_head = nn.Linear(8, 10, bias=False)
    opt = build_optimizer(model, OptimConfig(), device=CPU)
    for _ in range(2):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()
    return model, opt


def test_names_follow_the_groups() -> None:
    model, opt = model_and_optimizer()
    muon, adamw = opt.parts
    assert [(g, n) for g, n, _ in flat.names(muon)] == [("muon", "hidden.weight")]
    assert [(g, n) for g, n, _ in flat.names(adamw)] == [
        ("embed", "embed.weight"), ("head", "lm_head.weight")
    ]  # fmt: skip
    assert flat.names(muon)[0][2] is model.hidden.weight


def test_flat_state_holds_the_live_tensors() -> None:
    _, opt = model_and_optimizer()
    state = flat.flat_state(opt.parts)
    assert sorted(state) == [
        "embed/embed.weight/exp_avg", "embed/embed.weight/exp_avg_sq", "embed/embed.weight/step",
        "head/lm_head.weight/exp_avg", "head/lm_head.weight/exp_avg_sq",
        "head/lm_head.weight/step", "muon/hidden.weight/momentum_buffer",
    ]  # fmt: skip
    muon = opt.parts[0]
    live = muon.state[muon.param_groups[0]["params"][0]]["momentum_buffer"]
    assert state["muon/hidden.weight/momentum_buffer"] is live  # not a copy


def test_positional_round_trip() -> None:
    """from_positional names a state_dict's tensors; to_positional gives load_state_dict's
    form back, equal to the original."""
    _, opt = model_and_optimizer()
    states = opt.state_dict()
    named = flat.from_positional(opt.parts, states)
    assert named.keys() == flat.flat_state(opt.parts).keys()
    back = flat.to_positional(opt.parts, named)
    for a, b in zip(back, states, strict=True):
        assert a["state"].keys() == b["state"].keys()
        for number, values in b["state"].items():
            for key, value in values.items():
                assert torch.equal(a["state"][number][key], value)


def test_copy_global_checks_the_shape() -> None:
    target = torch.zeros(3, 2)
    flat.copy_global(target, torch.ones(3, 2))
    assert torch.equal(target, torch.ones(3, 2))
    scalar = torch.tensor(0.0)
    flat.copy_global(scalar, torch.tensor(5.0))
    assert scalar.item() == 5.0
    with pytest.raises(ValueError, match=r"shape \(2, 3\) saved, \(3, 2\) here"):
        flat.copy_global(target, torch.ones(2, 3))


def test_init_state_creates_the_first_steps_state_without_moving_anything() -> None:
    torch.manual_seed(0)
    w = nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([{"params": [("w", w)], "name": "g"}], lr=0.1, weight_decay=0.1)
    before = w.detach().clone()
    flat.init_state(opt)
    assert torch.equal(w, before) and w.grad is None
    state = opt.state[w]
    assert state["step"].item() == 0
    assert torch.equal(state["exp_avg"], torch.zeros(4, 3))
    assert opt.param_groups[0]["lr"] == 0.1  # restored
    flat.init_state(opt)  # nothing missing: no step at all
    assert state["step"].item() == 0


def test_a_pairs_sums_saved_per_rank_load_whole_as_their_mean() -> None:
    """Sharded ranks save an Adam pair's partial sums stacked (optim/adam.py); a layout that
    keeps the sum whole (replicated, FSDP's rows) takes their mean, the sum of averages."""
    target = torch.zeros(4, 3)
    stacked = torch.stack([torch.full((4, 3), 1.0), torch.full((4, 3), 3.0)])
    assert torch.equal(flat.whole_sum("embed/embed.weight/grad_sum", target, stacked),
                       torch.full((4, 3), 2.0))  # fmt: skip
    whole = torch.ones(4, 3)
    assert flat.whole_sum("embed/embed.weight/grad_sum", target, whole) is whole
    moments = torch.ones(2, 4, 3)  # another key is never folded (its shape error stays)
    assert flat.whole_sum("embed/embed.weight/exp_avg", target, moments) is moments
