"""record_2026_07_17's tied token table and head (docs/records.md D.3 "The tied head and embedding",
D.10 item 6; optim/tied.py) against the rule written out in float64: while tied, at each Adam update
(odd steps, two summed gradients) E's sum joins W's, W takes one Adam step and E becomes W, E's
state idle; after the update of step s_split E's m, v, t become W's; then they step apart. With
negative controls (no gradient sum, no state copy, the copy a pair early or late), exact resume on
either side of the split, and the option's checks."""

import io

import pytest
import torch
from torch import nn

from optim import build_optimizer
from optim.adam import Adam
from optim.config import AdamWConfig, OptimConfig
from optim.tied import TiedEmbedHead
from tests.helpers import compose_config
from trainer.config import to_config

CPU = torch.device("cpu")
SPLIT = 5  # s_split: the update of step 5 (W's third, t = 3) is the last tied one
STEPS = 10
SHAPE = (6, 4)
EPS = 1e-10
# Different settings for the two groups, so a copy of the wrong state or a step with the
# wrong group shows; W's as record_2026_07_17's head (lr 0.008, betas (0.5, 0.95), decay).
E_SET = {"lr": 0.03, "betas": (0.9, 0.99), "weight_decay": 0.0}
W_SET = {"lr": 0.008, "betas": (0.5, 0.95), "weight_decay": 0.5}


def gradients(seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(SHAPE, generator=gen, dtype=torch.float64),
         torch.randn(SHAPE, generator=gen, dtype=torch.float64))
        for _ in range(STEPS)
    ]  # fmt: skip


def adam_step(p, st, g, s):
    """One Adam update in float64 (raw ε, decoupled decay as optim/adam.py) of p with state
    st = [m, v, t] and settings s; returns the new p and state."""
    m, v, t = st
    b1, b2 = s["betas"]
    t += 1
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    p = p * (1 - s["lr"] * s["weight_decay"])
    p = p - s["lr"] * ((1 - b2**t) ** 0.5 / (1 - b1**t)) * m / (v.sqrt() + EPS)
    return p, [m, v, t]


def reference(w0, gs, split=SPLIT, sum_grads=True, copy_state=True, tied=True):
    """(E, W, E's state, W's state) after each step of the rule; the flags break one part."""
    zero = [torch.zeros(SHAPE, dtype=torch.float64)] * 2 + [0]
    e, w, se, sw = w0.clone(), w0.clone(), list(zero), list(zero)
    acc_e = acc_w = 0.0
    out = []
    for s, (ge, gw) in enumerate(gs):
        acc_e, acc_w = acc_e + ge, acc_w + gw
        if s % 2 == 1:
            if tied and s <= split:
                w, sw = adam_step(w, sw, acc_w + acc_e if sum_grads else acc_w, W_SET)
                e = w.clone()  # Eᵀ ← W: the transpose is the identity for (vocab, d) tables
                if s == split and copy_state:
                    se = [sw[0].clone(), sw[1].clone(), sw[2]]
            else:
                e, se = adam_step(e, se, acc_e, E_SET)
                w, sw = adam_step(w, sw, acc_w, W_SET)
            acc_e = acc_w = 0.0
        out.append((e.clone(), w.clone(), list(se), list(sw)))
    return out


def make(split: int = SPLIT):
    """E, W (equal at the start, as model.embed.tied_init) and their Adam, tied until `split`
    (0: untied)."""
    w0 = torch.randn(SHAPE, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    e, w = nn.Parameter(w0.clone()), nn.Parameter(w0.clone())
    opt = Adam(
        [{"params": [e], **E_SET}, {"params": [w], **W_SET}],
        AdamWConfig(eps=EPS, eps_placement="raw", update_every=2),
    )
    if split:
        opt.tie = TiedEmbedHead(e, w, (split + 1) // 2)
    return e, w, opt, w0


def run(e, w, opt, gs, start: int = 0):
    out = []
    for ge, gw in gs[start:]:
        e.grad, w.grad = ge.clone(), gw.clone()
        opt.step()
        e.grad = w.grad = None
        se, sw = opt.state[e], opt.state[w]
        states = [[st["exp_avg"].clone(), st["exp_avg_sq"].clone(), int(st["step"])]
                  for st in (se, sw)]  # fmt: skip
        out.append((e.detach().clone(), w.detach().clone(), *states))
    return out


def same(a, b) -> bool:
    """Two trajectories agree to float64 rounding (E, W, and both states, at every step)."""
    for (ea, wa, sea, swa), (eb, wb, seb, swb) in zip(a, b, strict=True):
        tensors = [(ea, eb), (wa, wb), (sea[0], seb[0]), (sea[1], seb[1]),
                   (swa[0], swb[0]), (swa[1], swb[1])]  # fmt: skip
        if not all(
            torch.allclose(x, torch.as_tensor(y), rtol=1e-12, atol=1e-14) for x, y in tensors
        ):
            return False
        if (sea[2], swa[2]) != (seb[2], swb[2]):
            return False
    return True


def test_tied_split_and_separate_steps_follow_the_rule() -> None:
    gs = gradients()
    e, w, opt, w0 = make()
    got, want = run(e, w, opt, gs), reference(w0, gs)
    assert same(got, want)
    for s in range(SPLIT):  # tied: E is W, E's state idle
        assert torch.equal(got[s][0], got[s][1]) and got[s][2][2] == 0
        assert not got[s][2][0].any() and not got[s][2][1].any()
    e5, w5, se5, sw5 = got[SPLIT]  # the split: the tied update, then W's state copied once
    assert torch.equal(e5, w5) and se5[2] == sw5[2] == 3
    assert torch.equal(se5[0], sw5[0]) and torch.equal(se5[1], sw5[1])
    assert not torch.equal(got[SPLIT + 2][0], got[SPLIT + 2][1])  # apart from step 7 on
    assert got[SPLIT + 2][2][2] == got[SPLIT + 2][3][2] == 4


@pytest.mark.parametrize(
    "broken",
    [{"sum_grads": False}, {"copy_state": False}, {"split": SPLIT - 2}, {"split": SPLIT + 2}],
    ids=["no-gradient-sum", "state-not-copied", "copy-a-pair-early", "copy-a-pair-late"],
)
def test_misreadings_differ(broken: dict) -> None:
    gs = gradients()
    e, w, opt, w0 = make()
    assert not same(run(e, w, opt, gs), reference(w0, gs, **broken))


def test_off_is_two_independent_adams() -> None:
    gs = gradients(1)
    e, w, opt, w0 = make(split=0)
    assert same(run(e, w, opt, gs), reference(w0, gs, tied=False))


@pytest.mark.parametrize("at", [2, 3, 5, 6])
def test_resume_either_side_of_the_split_is_exact(at: int) -> None:
    """A checkpoint after step `at` (inside a pair, at the last tied update, after the split)
    goes on bit for bit as the run that never stopped; nothing of the tie is saved."""
    gs = gradients(2)
    e, w, opt, _ = make()
    full = run(e, w, opt, gs)
    e, w, opt, _ = make()
    run(e, w, opt, gs[: at + 1])
    buf = io.BytesIO()
    torch.save({"e": e.detach(), "w": w.detach(), "opt": opt.state_dict()}, buf)
    buf.seek(0)
    saved = torch.load(buf)
    e2, w2, opt2, _ = make()
    with torch.no_grad():
        e2.copy_(saved["e"]), w2.copy_(saved["w"])
    opt2.load_state_dict(saved["opt"])
    rest = run(e2, w2, opt2, gs, start=at + 1)
    for a, b in zip(full[at + 1 :], rest, strict=True):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert torch.equal(a[2][0], b[2][0]) and a[2][2] == b[2][2]


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(*SHAPE)
        self.lm_head = nn.Linear(SHAPE[1], SHAPE[0], bias=False)
        self.gain = nn.Parameter(torch.ones(SHAPE[1]))


def config(**kw) -> OptimConfig:
    return OptimConfig(adamw=AdamWConfig(eps_placement="raw", update_every=2), **kw)


def test_build_attaches_the_tie_and_checkpoints_through_the_combined_object() -> None:
    model = Toy().double()
    with torch.no_grad():
        model.embed.weight.copy_(model.lm_head.weight)
    opt = build_optimizer(model, config(tie_embed_head_until=SPLIT), device=CPU)
    adam = opt.parts[-1]
    assert isinstance(adam.tie, TiedEmbedHead) and adam.tie.split_update == 3
    assert adam.tie.embed is model.embed.weight and adam.tie.head is model.lm_head.weight
    assert build_optimizer(Toy(), config(), device=CPU).parts[-1].tie is None
    gs = gradients(3)
    for ge, gw in gs[: SPLIT + 1]:
        model.embed.weight.grad, model.lm_head.weight.grad = ge.clone(), gw.clone()
        opt.step()
        opt.zero_grad()
    assert torch.equal(model.embed.weight, model.lm_head.weight)
    flat = opt.flat_state()
    keys = [k for k in flat if k.startswith("embed/embed.weight/")]
    assert keys and int(flat["embed/embed.weight/step"]) == 3


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"tie_embed_head_until": -1}, r"tie_embed_head_until must be an integer >= 0"),
        ({"tie_embed_head_until": 4}, r"tie_embed_head_until \(4\) must be a step on which"),
    ],
)
def test_option_checks(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        config(**kw).validate(STEPS)
    with pytest.raises(ValueError, match=r"tie_embed_head_until runs inside optim/adam.py"):
        OptimConfig(tie_embed_head_until=5).validate(STEPS)


def test_needs_tied_init(tmp_path) -> None:
    tie = ["optim.adamw.update_every=2", "optim.tie_embed_head_until=5", f"run_dir={tmp_path}"]
    with pytest.raises(ValueError, match=r"needs model.embed.tied_init=true"):
        to_config(compose_config(tie))


def test_build_checks_the_pair() -> None:
    class NoHead(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(*SHAPE)

    with pytest.raises(ValueError, match=r"the model has no lm_head.weight"):
        build_optimizer(NoHead(), config(tie_embed_head_until=5), device=CPU)
    model = Toy()
    model.lm_head = nn.Linear(SHAPE[1], SHAPE[0] + 1, bias=False)
    with pytest.raises(ValueError, match=r"must have the same shape"):
        build_optimizer(model, config(tie_embed_head_until=5), device=CPU)


def test_a_tie_past_the_run_is_named_at_start(tmp_path) -> None:
    """record_2026_07_17's preset shortened below its split (921) keeps the pair tied throughout:
    the run's start says so and names the key; a split inside the run says nothing."""
    import dataclasses

    from trainer.observe.console import tie_outlasts_run

    base = to_config(compose_config([
        "experiment=record_2026_07_17", "train.steps=100", "train.extension_steps=1",
        f"run_dir={tmp_path}",
    ]))  # fmt: skip

    def conf(steps: int) -> object:
        return dataclasses.replace(base, train=dataclasses.replace(base.train, steps=steps))

    warning = tie_outlasts_run(conf(100))
    assert warning is not None and "optim.tie_embed_head_until=921" in warning
    assert "train.steps=100" in warning
    # Adam updates on odd steps: after the last tied one (921) the first apart is 923
    assert tie_outlasts_run(conf(923)) is not None  # steps 0..922: never apart
    assert tie_outlasts_run(conf(924)) is None  # step 923 updates them apart
