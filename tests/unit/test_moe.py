"""The mixture-of-experts MLP and Muon on its expert stacks, against float64 references.

MoE: the forward equals a per-token loop of the specified formula (fp32 router softmax, top-k,
gates renormalised over the k chosen, Σ g_e·W_proj[e]·relu(W_fc[e]·u)²); in training with
α > 0 the backward adds exactly the gradient of α·E·Σ f_e·P_e / micro_steps (f detached) to
the data gradient while the output is unchanged; eval mode and α = 0 add nothing; the default
hidden width and the config's refusals. Muon: an (E, out, in) stack marked `stack_of` steps
each expert exactly as a 2-D parameter of its own would (orthogonalisation and LR scale per
matrix); unmarked stacks are refused, directly and through `mark_stacks`.
"""

import pytest
import torch
import torch.nn.functional as F

from model.config import ModelConfig
from model.moe import MoE
from optim.config import MuonConfig
from optim.muon.optimizer import Muon
from optim.muon.stacks import mark_stacks

F64 = torch.float64
D = 16


def make_moe(experts: int, top_k: int, *, hidden: int = 8, balance: float = 0.0, seed: int = 0):
    """A float64 MoE with every weight random: `reset` zeroes proj, which would hide the
    output (and the router's data-path gradient)."""
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=D)
    cfg.mlp.experts, cfg.mlp.top_k = experts, top_k
    cfg.mlp.expert_hidden, cfg.mlp.balance = hidden, balance
    moe = MoE(cfg).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (moe.router.weight, moe.experts.fc, moe.experts.proj):
            # 0.5 keeps the softmax away from saturation, so every expert's gate matters.
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=F64))
    return moe


def reference(moe: MoE, x: torch.Tensor, experts: int, top_k: int, alpha=0.0, micro_steps=1):
    """(output, balance term) written out token by token from the spec, differentiable."""
    u = x.reshape(-1, x.shape[-1])
    # The router's probabilities are specified in fp32 even for fp64 input; the same rounding
    # here keeps the comparison tight (fp32 → fp64 is exact, so the top-k order is the same).
    probs = F.linear(u, moe.router.weight).float().softmax(-1).to(F64)
    fc, proj = moe.experts.fc, moe.experts.proj
    counts = [0] * experts
    rows = []
    for n in range(u.shape[0]):
        chosen = torch.topk(probs[n], top_k).indices.tolist()
        total = sum(probs[n, e] for e in chosen)
        rows.append(
            sum(probs[n, e] / total * proj[e] @ torch.relu(fc[e] @ u[n]).square() for e in chosen)
        )
        for e in chosen:
            counts[e] += 1
    f = torch.tensor(counts, dtype=F64) / (u.shape[0] * top_k)  # a constant: no gradient
    balance = alpha * experts * (f * probs.mean(0)).sum() / micro_steps
    return torch.stack(rows).reshape(x.shape), balance


@pytest.mark.parametrize(("experts", "top_k"), [(4, 2), (4, 1), (3, 3)])
def test_forward_matches_per_token_formula(experts: int, top_k: int) -> None:
    """(3, 3) routes every token to every expert: the gates are then the probabilities."""
    moe = make_moe(experts, top_k).eval()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(1), dtype=F64)
    got = moe(x)
    want, _ = reference(moe, x, experts, top_k)
    assert got.shape == x.shape and got.dtype == F64
    # rtol 1e-6: the gates are renormalised in fp32 or fp64, whichever the implementation picks.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("micro_steps", [1, 3])
def test_balance_gradient_is_added_in_backward_only(micro_steps: int) -> None:
    experts, top_k, alpha = 4, 2, 0.5  # α large enough that the term is well above tolerance
    moe = make_moe(experts, top_k, balance=alpha).train()
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, D, generator=gen, dtype=F64, requires_grad=True)
    w = torch.randn(2, 5, D, generator=gen, dtype=F64)
    leaves = [moe.router.weight, moe.experts.fc, moe.experts.proj, x]

    y = moe(x, micro_steps)
    (y * w).sum().backward()
    got = [p.grad.clone() for p in leaves]

    ref_y, balance = reference(moe, x, experts, top_k, alpha, micro_steps)
    term = torch.autograd.grad(balance, leaves[0], retain_graph=True)[0]
    want = torch.autograd.grad((ref_y * w).sum() + balance, leaves)

    # The term enters the gradient, never the returned values.
    torch.testing.assert_close(y.detach(), ref_y.detach(), rtol=1e-6, atol=1e-9)
    # The fp32 softmax's backward rounds at ~1e-7 of each gradient's scale (measured ≤ 1.3e-7):
    # tolerate 1e-6 of it, ~1e-5 absolute here, against a term of 1e-2 (÷ 3 for micro_steps).
    for name, a, b in zip(["router", "fc", "proj", "x"], got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item(), msg=name)
    # Not vacuous: the term moves the router's gradient far beyond that tolerance.
    assert term.abs().max() > 1e-3


@pytest.mark.parametrize(
    ("train", "alpha", "expect_term"), [(False, 0.5, False), (True, 0.0, False), (True, 0.5, True)]
)
def test_router_gradient_only_from_training_balance(train, alpha, expect_term) -> None:
    """proj = 0 makes the output 0 whatever the gates, so the data path gives the router no
    gradient: whatever reaches it is the balance term."""
    moe = make_moe(4, 2, balance=alpha).train(train)
    with torch.no_grad():
        moe.experts.proj.zero_()
    # 7 tokens × 2 slots cannot split evenly over 4 experts: with f uniform the term's router
    # gradient would vanish (Σ_e ∂P_e = 0) and the train case could not tell it apart.
    x = torch.randn(1, 7, D, generator=torch.Generator().manual_seed(3), dtype=F64)
    moe(x).sum().backward()
    g = moe.router.weight.grad
    term = g is not None and bool(g.abs().max() > 1e-6)
    assert term == expect_term


@pytest.mark.parametrize("top_k", [1, 2])
def test_default_hidden_width_keeps_active_parameters_dense(top_k: int) -> None:
    moe = make_moe(4, top_k, hidden=0)
    assert moe.experts.fc.shape == (4, 4 * D // top_k, D)
    assert moe.experts.proj.shape == (4, D, 4 * D // top_k)
    assert moe.router.weight.shape == (4, D)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"experts": 1}, "model.mlp.experts"),
        ({"experts": 4, "top_k": 0}, "model.mlp.top_k"),
        ({"experts": 4, "top_k": 5}, "model.mlp.top_k"),
        ({"experts": 4, "fp8": "up"}, "model.mlp.fp8"),
    ],
)
def test_bad_expert_settings_rejected(settings: dict, key: str) -> None:
    cfg = ModelConfig(n_layer=2, n_head=2, n_embd=D)
    cfg.numerics.dtype = "bf16"  # so that fp8's own requirement is met and only experts refuse
    for name, value in settings.items():
        setattr(cfg.mlp, name, value)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        cfg.validate()
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        cfg.mlp.validate()


# --- Muon on an expert stack ---------------------------------------------------------------


def muon_run(params: list, grads: list, lr_scale: str) -> None:
    """Three fp64 steps; decay and the LR scale are per-matrix settings, so they are on."""
    settings = MuonConfig(lr=0.05, momentum=0.9, weight_decay=0.1, lr_scale=lr_scale)
    opt = Muon(params, settings, ns_dtype=F64)
    for gs in grads:
        for p, g in zip(params, gs, strict=True):
            p.grad = g.clone()
        opt.step()


@pytest.mark.parametrize("lr_scale", ["original", "unit_rms_norm"])
@pytest.mark.parametrize("shape", [(12, 8), (8, 12)], ids=["tall", "wide"])
def test_stack_steps_each_expert_as_its_own_matrix(shape: tuple, lr_scale: str) -> None:
    experts = 3
    gen = torch.Generator().manual_seed(4)
    w0 = torch.randn(experts, *shape, generator=gen, dtype=F64)
    grads = [torch.randn(experts, *shape, generator=gen, dtype=F64) for _ in range(3)]

    stack = torch.nn.Parameter(w0.clone())
    stack.stack_of = "experts"
    muon_run([stack], [[g] for g in grads], lr_scale)

    alone = [torch.nn.Parameter(w0[e].clone()) for e in range(experts)]
    muon_run(alone, [list(g.unbind(0)) for g in grads], lr_scale)

    assert not torch.equal(stack.detach(), w0)
    for e in range(experts):
        torch.testing.assert_close(stack.detach()[e], alone[e].detach(), rtol=0, atol=1e-12)


def test_unmarked_stack_is_refused() -> None:
    with pytest.raises(ValueError, match=r"optim\.muon\.expert_keys"):
        Muon([torch.nn.Parameter(torch.zeros(2, 4, 4))])


def test_mark_stacks_marks_matches_and_refuses_the_rest() -> None:
    p3d = torch.nn.Parameter(torch.zeros(3, 4, 4))
    mark_stacks([("blocks.0.mlp.experts.fc", p3d)], ["*.experts.*"])
    assert p3d.stack_of == "experts"
    # A matched key on a plain matrix is a config mistake, not a stack.
    p2d = torch.nn.Parameter(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"optim\.muon\.expert_keys"):
        mark_stacks([("blocks.0.mlp.experts.fc", p2d)], ["*.experts.*"])
    # An unmatched 3-D parameter is named so the user knows which key to add.
    with pytest.raises(ValueError, match="'w'"):
        mark_stacks([("w", torch.nn.Parameter(torch.zeros(3, 4, 4)))], [])


def test_bf16_autocast_runs_and_rounds_like_its_fp32_forward() -> None:
    """Under CPU bf16 autocast (train.autocast=bf16) the experts' products come back in bf16
    while the stream stays fp32: the mixture must add them into its fp32 output, within bf16
    rounding of the fp32 forward, and backpropagate to every weight."""
    moe = make_moe(4, 2, balance=0.01).float().train()
    x = torch.randn(2, 5, D, generator=torch.Generator().manual_seed(3))
    want = moe(x).detach()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = moe(x)
    got.float().square().sum().backward()
    assert got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=0.05, atol=0.05 * want.abs().max().item())
    for p in (moe.router.weight, moe.experts.fc, moe.experts.proj):
        assert p.grad is not None and p.grad.abs().sum() > 0
