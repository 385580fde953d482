"""optim/combined.py: the one optimizer object, its step values and its state."""

import copy

import pytest
import torch
from torch import nn

from optim import CombinedOptimizer, Muon, build_optimizer
from optim.config import OptimConfig
from optim.schedule import OptimValues, lr_multiplier, optim_values

CPU = torch.device("cpu")


def small_model() -> nn.Module:
    model = nn.Module()
    model.embed = nn.Embedding(10, 8)
    model.hidden = nn.Linear(8, 8, bias=False)
    model.gain = nn.Parameter(torch.ones(8))
    model.lm_head = nn.Linear(8, 10, bias=False)
    return model


def schedule_cfg(name: str) -> OptimConfig:
    cfg = OptimConfig(name=name)
    cfg.schedule.warmup_steps = 10
    cfg.schedule.cooldown_frac = 0.3
    cfg.schedule.min_lr_frac = 0.1
    cfg.muon.momentum_warmup_steps = 20
    return cfg


def set_step(opt: CombinedOptimizer, cfg: OptimConfig, step: int) -> OptimValues:
    """The loop's part: the schedule's values for `step` of 100, handed to the optimizer."""
    values = optim_values(cfg, step, 100)
    opt.set_step(values)
    return values


def stepped(model: nn.Module, opt: CombinedOptimizer, steps: int = 3) -> None:
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt.step()


@pytest.mark.parametrize("name", ["muon_adamw", "adamw"])
@pytest.mark.parametrize("step", [0, 9, 15, 50, 70, 99])
def test_set_step_sets_every_group(name: str, step: int) -> None:
    cfg = schedule_cfg(name)
    opt = build_optimizer(small_model(), cfg, device=CPU)
    values = set_step(opt, cfg, step)
    assert values.lr_mult == lr_multiplier(step, 100, 10, 0.3, 0.1)
    a = cfg.adamw
    built_lrs = {"muon": cfg.muon.lr, "hidden": a.hidden_lr, "embed": a.embed_lr}
    built_lrs |= {"head": a.head_lr, "scalar": a.scalar_lr}
    expected_groups = ["embed", "head", "scalar"]
    expected_groups.insert(0, "muon" if name == "muon_adamw" else "hidden")
    assert list(opt.lrs()) == expected_groups
    for group, value in opt.lrs().items():
        assert value == pytest.approx(built_lrs[group] * values.lr_mult)
    if name == "muon_adamw":
        muon = opt.parts[0]
        assert isinstance(muon, Muon)
        assert muon.param_groups[0]["momentum"] == pytest.approx(0.85 + min(step, 20) / 20 * 0.1)


def test_set_step_does_not_compound() -> None:
    """Each call sets lr from the base LR, so the LR at a step does not depend on the past."""
    cfg = schedule_cfg("muon_adamw")
    opt = build_optimizer(small_model(), cfg, device=CPU)
    for step in range(100):
        set_step(opt, cfg, step)
    final = 0.1 + 0.9 / 30  # the last of 30 cooldown steps, one step above the 0.1 floor
    assert opt.lrs()["muon"] == pytest.approx(cfg.muon.lr * final)
    set_step(opt, cfg, 0)
    assert opt.lrs()["muon"] == pytest.approx(cfg.muon.lr * lr_multiplier(0, 100, 10, 0.3, 0.1))


def test_scheduled_momentum_follows_the_group_flag_not_the_class() -> None:
    """A group takes the schedule's momentum when it says so ("scheduled_momentum"), whatever
    optimizer holds it; the others keep theirs."""
    a, b = nn.Parameter(torch.zeros(4, 4)), nn.Parameter(torch.zeros(4, 4))
    muon = Muon([{"params": [a], "name": "fixed", "initial_lr": 0.02}], momentum=0.5)
    sgd = torch.optim.SGD(
        [{"params": [b], "name": "sgd", "initial_lr": 0.1, "scheduled_momentum": True}], lr=0.1
    )
    opt = CombinedOptimizer([muon, sgd], "test")
    opt.set_step(OptimValues(lr_mult=0.5, muon_momentum=0.9))
    assert muon.param_groups[0]["momentum"] == 0.5 and sgd.param_groups[0]["momentum"] == 0.9
    assert opt.lrs() == {"fixed": 0.01, "sgd": 0.05}


def test_state_round_trip_keeps_this_runs_hyperparameters() -> None:
    """A resumed run takes momentum and moments from the checkpoint, LRs from its config."""
    torch.manual_seed(0)
    model = small_model()
    opt = build_optimizer(model, schedule_cfg("muon_adamw"), device=CPU)
    stepped(model, opt)
    saved = copy.deepcopy(opt.state_dict())
    lowered = schedule_cfg("muon_adamw")
    lowered.adamw.head_lr = 0.001
    again = build_optimizer(model, lowered, device=CPU)
    again.load_state_dict(saved)
    assert again.lrs()["head"] == 0.001
    for a, b in zip(again.state_dict(), saved, strict=True):
        for key, state in b["state"].items():
            for name, value in state.items():
                assert torch.equal(a["state"][key][name], value), (key, name)
    with pytest.raises(ValueError, match="the saved state has 1 optimizers, this run has 2"):
        again.load_state_dict(saved[:1])
    two_groups = copy.deepcopy(saved)
    two_groups[0]["param_groups"].append(two_groups[0]["param_groups"][0])
    with pytest.raises(ValueError, match="saved Muon has 2 parameter groups, this run's has 1"):
        again.load_state_dict(two_groups)


def test_flat_state_names_and_loads_from_any_layout() -> None:
    """flat_state() names every state tensor; load_flat copies whole tensors in place when the
    names match, and goes through positional state when this run has none yet."""
    torch.manual_seed(0)
    model = small_model()
    opt = build_optimizer(model, OptimConfig(), device=CPU)
    stepped(model, opt)
    flat = {k: v.clone() for k, v in opt.flat_state().items()}
    assert "muon/hidden.weight/momentum_buffer" in flat
    assert {"embed/embed.weight/exp_avg", "scalar/gain/exp_avg_sq"} <= flat.keys()
    fresh = build_optimizer(small_model(), OptimConfig(), device=CPU)
    assert fresh.flat_state() == {}  # no step yet: nothing to name
    fresh.load_flat(flat)  # positional route
    assert all(torch.equal(fresh.flat_state()[k], v) for k, v in flat.items())
    doubled = {k: v * 2 for k, v in flat.items()}
    fresh.load_flat(doubled)  # in place: the same names on both sides
    assert all(torch.equal(fresh.flat_state()[k], v) for k, v in doubled.items())


def test_init_state_is_what_the_first_step_creates() -> None:
    """init_state() creates every state tensor without moving a parameter, and the first
    real step then gives what it gives without it."""
    torch.manual_seed(0)
    model, twin = small_model(), small_model()
    twin.load_state_dict(model.state_dict())
    eager = build_optimizer(model, OptimConfig(), device=CPU)
    lazy = build_optimizer(twin, OptimConfig(), device=CPU)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    eager.init_state()
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert len(eager.flat_state()) == 1 + 3 * 3  # Muon: a buffer; AdamW: step and 2 moments
    grads = [torch.randn_like(p) for p in model.parameters()]
    for m in (model, twin):
        for p, g in zip(m.parameters(), grads, strict=True):
            p.grad = g.clone()
    eager.step()
    lazy.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_construction_errors() -> None:
    with pytest.raises(ValueError, match="no trainable parameters"):
        CombinedOptimizer([], "empty")
    p = nn.Parameter(torch.zeros(2))
    twice = [torch.optim.SGD([{"params": [p], "name": "x"}], lr=0.1) for _ in range(2)]
    with pytest.raises(ValueError, match="param group names must be unique"):
        CombinedOptimizer(twice, "twice")


def test_params_zero_grad_and_the_groups_table() -> None:
    model = small_model()
    opt = build_optimizer(model, OptimConfig(), device=CPU)
    assert opt.params() == [model.hidden.weight, model.embed.weight, model.lm_head.weight,
                            model.gain]  # fmt: skip
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    rows = opt.groups_table.splitlines()
    assert rows[0].split() == ["group", "optimizer", "lr", "betas", "/", "momentum", "eps",
                               "wd", "tensors", "params", "holds"]  # fmt: skip
    assert rows[1].split()[:3] == ["muon", "Muon", "0.02"] and "hidden.weight" in rows[1]
    assert rows[2].split()[:3] == ["embed", "AdamW", "0.3"] and rows[2].endswith("embed.weight")
    with opt.resident():  # no offload: a no-op
        pass


def test_a_group_saved_in_another_order_loads_by_name() -> None:
    """A layout that registers the parameters in another order (the model's parts,
    trainer/checkpoint/upgrade.py) still loads each moment into its own parameter: the
    saved group is put in this run's order by its names."""
    torch.manual_seed(0)
    model = small_model()
    model.bias = nn.Parameter(torch.zeros(3))  # a second scalar of another shape than `gain`
    opt = build_optimizer(model, schedule_cfg("muon_adamw"), device=CPU)
    stepped(model, opt)
    saved = copy.deepcopy(opt.state_dict())
    adam = saved[-1]
    group = next(g for g in adam["param_groups"] if g["name"] == "scalar")
    assert group["param_names"] == ["gain", "bias"]
    group["params"].reverse()  # as a save with the other registration order holds it
    group["param_names"].reverse()
    again = build_optimizer(model, schedule_cfg("muon_adamw"), device=CPU)
    again.load_state_dict(saved)
    for p in (model.gain, model.bias):
        assert torch.equal(again.parts[-1].state[p]["exp_avg"], opt.parts[-1].state[p]["exp_avg"])
    # Control: loaded by place (names that say nothing new), `gain` gets `bias`'s moments.
    group["param_names"] = ["gain", "bias"]
    by_place = build_optimizer(model, schedule_cfg("muon_adamw"), device=CPU)
    by_place.load_state_dict(saved)
    assert by_place.parts[-1].state[model.gain]["exp_avg"].shape == model.bias.shape
    group["param_names"] = ["gain", "other"]
    with pytest.raises(ValueError, match=r"holds other parameters than this run's: \['bias'"):
        build_optimizer(model, schedule_cfg("muon_adamw"), device=CPU).load_state_dict(saved)


@pytest.mark.parametrize("compiled", [False, True])
def test_the_step_is_named_in_a_profiler_trace(compiled: bool) -> None:
    """Each part's step and Muon's phases are ranges of a torch.profiler trace, nested as they
    run: the eager Muon's momentum, Newton–Schulz and finish inside optim.muon, the banks
    (optim.compile, here uncompiled banks) as one range; Adam's beside it."""
    model = small_model()
    cfg = OptimConfig(compile=compiled, compile_backend="eager")
    cfg.adamw.eps_placement = "raw"  # optim/adam.py's Adam, named optim.adam
    opt = build_optimizer(model, cfg, device=CPU)
    model.lm_head(model.hidden(model.embed(torch.tensor([1, 2])) * model.gain)).sum().backward()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    events = prof.events()
    names = {e.name for e in events}
    muon = ["muon.banks"] if compiled else ["muon.momentum", "muon.newton_schulz", "muon.finish"]
    assert {"optim.muon", "optim.adam", *muon} <= names
    outer = next(e for e in events if e.name == "optim.muon")
    for name in muon:
        inner = next(e for e in events if e.name == name)
        assert outer.time_range.start <= inner.time_range.start
        assert inner.time_range.end <= outer.time_range.end
