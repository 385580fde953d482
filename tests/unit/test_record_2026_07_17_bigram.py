"""record_2026_07_17's bigram-hash embedding (docs/records.md, record #89's bigram-hash embedding:
D.1 forward steps 2, 3 and 5), against the spec written out in float64, with token 1 hashing x_0
(bigram.position1=token; the record's reserved-row form is test_bigram_position1.py):

    h_0 = R − 1,  h_t = ((36,313·x_t) XOR (27,191·x_(t−1))) mod (R − 1),  per row of the batch
    σ_0 = 0,      σ_t = (x_(t−1) XOR x_t) mod N,      b_t = Bg[h_t] ⊙ S[σ_t]  (k channels)
    x = x0 + λ^bg_0·b on channels 0…k−1, and x0 itself with the in-place quirk (#83)
    after the attention (and x0 injection) of each layer ℓ ≥ 1 with attention: + λ^bg_ℓ·b

`reference()` writes the whole toy forward out by hand from the parameters, read by name; the
toy reads x0 after attention (λ^x0) and in the per-token skip gate, so the quirk shows."""

import math
import re
import warnings
from itertools import pairwise
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.bigram import bigram_indices
from model.config import update
from optim import build_optimizer
from optim.config import OptimConfig
from optim.partition import param_roles
from tests.reference import norm, rotate

R, K, N = 11, 8, 3  # toy table rows, channels, sign rows
BASE = update(
    ModelConfig(n_layer=4, n_head=2, n_embd=32, gate_channels=12),
    {"attention.layers": "AA.A", "residual.x0_after_attention": True,
     "residual.skips": [[0, 3]], "residual.skip_per_token": True},
)  # fmt: skip
ON = update(BASE, {"bigram.rows": R, "bigram.dim": K, "bigram.signs": N})
QUIRK = update(ON, {"bigram.in_x0": True})
ATTENTION = (0, 1, 3)  # layer 2 has no attention, so no injection
WRONG = ("no reserved row", "no signs", "flip quirk", "inject everywhere")


def hashes(idx: torch.Tensor, rows: int, signs: int, variant: str = "spec") -> tuple:
    """(h, σ) as nested lists of Python ints, one row at a time (the formula, no tensors)."""
    h, s = [], []
    for row in idx.tolist():
        first = (36313 * row[0]) % (rows - 1) if variant == "no reserved row" else rows - 1
        pairs = list(pairwise(row))  # (x_(t−1), x_t), t ≥ 1, within this row
        h.append([first] + [((36313 * c) ^ (27191 * p)) % (rows - 1) for p, c in pairs])
        s.append([0] + [(p ^ c) % signs for p, c in pairs])
    return h, s


def test_the_hash_is_the_formula() -> None:
    """Hand-picked ids at the record's sizes: the reserved row at t = 0 of every row, XOR and
    mod, the restart at each row (row 1's t = 1 pairs 5 with 1, not row 0's last token)."""
    idx = torch.tensor([[50303, 0, 1, 2, 50303, 50256], [5, 1, 2, 50256, 50303, 50303]])
    h, s = bigram_indices(idx, 754_560, 8_192)
    want_h, want_s = hashes(idx, 754_560, 8_192)
    assert h.tolist() == want_h and s.tolist() == want_s
    assert h[:, 0].tolist() == [754_559, 754_559] and s[:, 0].tolist() == [0, 0]
    assert h[0, 3] == (72_626 ^ 27_191) % 754_559 == 94_597  # x_(t−1) = 1, x_t = 2
    assert h[0, 5] == 697_450 and s[0, 5] == (50_303 ^ 50_256) % 8_192 == 47
    assert h[1, 1] == ((36_313 * 1) ^ (27_191 * 5)) % 754_559
    # x_(t−1) = x_t: the sign row is 0, and the hash is (36,313·x XOR 27,191·x) mod (R − 1)
    assert h[1, 5] == ((36_313 * 50_303) ^ (27_191 * 50_303)) % 754_559 and s[1, 5] == 0
    assert bigram_indices(idx, 754_560, 0)[1] is None  # no sign table
    # The record's int32 arithmetic: no overflow below 50,304, so the same rows as int64.
    assert 36_313 * 50_303 < 2**31 and 27_191 * 50_303 < 2**31
    drawn = torch.randint(0, 50_304, (1, 4000), generator=torch.Generator().manual_seed(0))
    x = torch.cat([drawn, torch.tensor([[50_303] * 3 + [0]])], 1)
    x32 = x.int()  # int32 tensor times a Python int stays int32, as the record computes
    h32 = torch.bitwise_xor(36_313 * x32[:, 1:], 27_191 * x32[:, :-1]) % 754_559
    s32 = torch.bitwise_xor(x32[:, :-1], x32[:, 1:]) % 8_192
    h64, s64 = bigram_indices(x, 754_560, 8_192)
    assert torch.equal(h64[:, 1:], h32.long()) and torch.equal(s64[:, 1:], s32.long())


def reference(model: GPT, idx: torch.Tensor, variant: str = "spec") -> torch.Tensor:
    """The toy's logits from the parameters, by name; other variants are misreadings."""
    cfg, P = model.cfg, dict(model.named_parameters())
    H, D, (B, T) = cfg.n_head, cfg.head_dim, idx.shape
    h, s = hashes(idx, R, N, variant)
    S = model.bigram.signs if variant != "no signs" else torch.ones_like(model.bigram.signs)
    b = P["bigram.embed.weight"][torch.tensor(h)] * S[torch.tensor(s)]  # (B, T, K)
    lam = P["bigram.lambdas"]

    def with_b(z: torch.Tensor, layer: int) -> torch.Tensor:
        return torch.cat([z[..., :K] + lam[layer] * b, z[..., K:]], -1)

    x0 = norm(P["embed.weight"][idx])
    x = with_b(x0, 0)
    quirk = cfg.bigram.in_x0 != (variant == "flip quirk")
    if quirk:
        x0 = x
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    outs = []
    for layer in range(cfg.n_layer):
        pre = f"blocks.{layer}."
        if layer == 3:  # the per-token skip 0 → 3 reads x0[0:12]
            gate = torch.sigmoid(P["scalars.skip_gate"]) * 2
            gate = gate * torch.sigmoid(x0[..., :12] @ P["skips.token_gate.weight"].T)
            x = x + gate * outs[0]
        if layer in ATTENTION:
            u = norm(x)
            q, k, v = ((u @ P[pre + f"attn.{n}.weight"].T).view(B, T, H, D) for n in "qkv")
            q, k = (rotate(norm(z), cfg.attention.rope_base) for z in (q, k))
            scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(D)
            weights = scores.masked_fill(~causal, -math.inf).softmax(-1)
            y = torch.einsum("bhij,bjhd->bihd", weights, v)
            x = x + y.reshape(B, T, H * D) @ P[pre + "attn.o.weight"].T
            x = x + P["x0_injection.lambdas"][layer] * x0
        if (layer in ATTENTION and layer >= 1) or (variant == "inject everywhere" and layer):
            x = with_b(x, layer)
        x = x + F.relu(norm(x) @ P[pre + "mlp.fc.weight"].T).square() @ P[pre + "mlp.proj.weight"].T
        outs.append(x)
    c = cfg.head.softcap
    return c * torch.tanh(norm(x) @ P["lm_head.weight"].T / c)


def randomised(cfg: ModelConfig) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "bigram.lambdas":  # distinct per layer, as are x0's
                p.copy_(torch.linspace(0.4, 1.1, p.numel()))
            else:
                p.copy_(torch.randn(p.shape) * 0.5)
    return model


def tokens(B: int = 2, T: int = 12) -> torch.Tensor:
    return torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(1))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("cfg", [ON, QUIRK], ids=["out of place (#62/#74)", "in x0 (#83)"])
def test_forward_and_gradients_match_the_spec(cfg: ModelConfig) -> None:
    model = randomised(cfg)
    idx = tokens()
    targets = idx.roll(-1, 1)
    got, want = model(idx), reference(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    names, params = zip(*model.named_parameters(), strict=True)
    g_got = torch.autograd.grad(F.cross_entropy(got.flatten(0, 1), targets.flatten()), params)
    g_want = torch.autograd.grad(F.cross_entropy(want.flatten(0, 1), targets.flatten()), params)
    for name, a, b in zip(names, g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=name)
    grads = dict(zip(names, g_got, strict=True))
    g_lam = grads["bigram.lambdas"]  # λ^bg_2 (no attention) is never read, the others are
    assert (g_lam[[0, 1, 3]] != 0).all() and g_lam[2] == 0
    rows = {r for row in hashes(idx, R, N)[0] for r in row}
    used = grads["bigram.embed.weight"].abs().sum(1) != 0
    assert set(used.nonzero().flatten().tolist()) == rows and R - 1 in rows
    # Negative controls: each misreading is far outside the tolerance.
    for variant in WRONG:
        assert rel(reference(model, idx, variant), got) > 1e-3, variant


def test_off_builds_nothing_and_the_zero_table_starts_as_the_identity() -> None:
    off = GPT(BASE)
    assert not any("bigram" in n for n in off.state_dict())
    torch.manual_seed(0)
    a = GPT(BASE)
    torch.manual_seed(0)
    on = GPT(QUIRK)
    # Its construction draws nothing before the other parameters: they are the same values.
    sd_on = on.state_dict()
    assert all(torch.equal(sd_on[k], v) for k, v in a.state_dict().items())
    new = sorted(sd_on.keys() - a.state_dict().keys())
    assert new == ["bigram.embed.weight", "bigram.lambdas", "bigram.signs"]
    assert not on.bigram.embed.weight.any()
    assert torch.equal(on.bigram.lambdas.detach(), torch.full((4,), 0.05))
    signs = on.bigram.signs
    assert signs.shape == (N, K) and set(signs.unique().tolist()) == {-1.0, 1.0}
    assert "bigram.signs" not in dict(on.named_parameters())  # a buffer: state, not trained
    # Weights random (the branches open), Bg = 0: bit for bit the model without the part.
    with torch.no_grad():
        for p in a.parameters():
            p.copy_(torch.randn(p.shape) * 0.5)
    on.load_state_dict(a.state_dict(), strict=False)
    idx = tokens()
    assert torch.equal(on(idx), a(idx))
    with torch.no_grad():
        on.bigram.embed.weight[R - 1] = 1.0  # control: the t = 0 row is read
    assert not torch.equal(on(idx), a(idx))


def test_bf16_model_roles_and_optimizer() -> None:
    """bf16: Bg and S bf16, λ^bg fp32 and rounded to bf16 where it meets the stream. Bg is
    Adam's embedding group, λ^bg a scalar; one optimizer step runs and moves both."""
    model = GPT(update(QUIRK, {"numerics.dtype": "bf16"}))
    assert model.bigram.embed.weight.dtype == model.bigram.signs.dtype == torch.bfloat16
    assert model.bigram.lambdas.dtype == torch.float32
    with torch.no_grad():
        for p in (model.bigram.embed.weight, model.lm_head.weight):
            p.normal_()  # Bg non-zero, and the head open so that it gets a gradient
        model.bigram.lambdas.copy_(torch.linspace(0.3, 0.7, 4))
    idx = tokens()
    x, x0, b = model._embed(idx)
    assert x is x0 and b.dtype == torch.bfloat16
    plain = F.rms_norm(model.embed(idx), (32,))
    term = model.bigram.lambdas[0].to(torch.bfloat16) * b
    assert torch.equal(x, torch.cat([plain[..., :K] + term, plain[..., K:]], -1))
    roles = {r: {n for n, _ in named} for r, named in param_roles(model).items()}
    assert "bigram.embed.weight" in roles["embed"] and "bigram.lambdas" in roles["scalar"]
    opt = build_optimizer(model, OptimConfig(), device=torch.device("cpu"))
    before = model.bigram.embed.weight.detach().clone(), model.bigram.lambdas.detach().clone()
    model(idx, idx.roll(-1, 1)).backward()
    opt.step()
    assert not torch.equal(model.bigram.embed.weight, before[0])
    assert not torch.equal(model.bigram.lambdas, before[1])


def test_the_sign_table_is_saved_and_restored(tmp_path: Path) -> None:
    """S is persistent: a checkpoint carries it, in both layouts, and a model drawn from
    another seed gets it back."""
    from trainer.checkpoint import dcp_state

    torch.manual_seed(0)
    a = GPT(ON)
    opt = build_optimizer(a, OptimConfig(), device=torch.device("cpu"))
    torch.manual_seed(1)
    b = GPT(ON)
    assert not torch.equal(a.bigram.signs, b.bigram.signs)
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.bigram.signs, b.bigram.signs)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp_state.save_sharded(tmp_path, a, opt)
        weights, _ = dcp_state.read_whole(tmp_path)
    assert torch.equal(weights["bigram.signs"], a.bigram.signs)
    torch.manual_seed(2)
    c = GPT(ON)
    c_opt = build_optimizer(c, OptimConfig(), device=torch.device("cpu"))
    dcp_state.load_whole_into_sharded(
        {"model": a.state_dict(), "optimizers": opt.state_dict()}, c, c_opt
    )
    assert torch.equal(c.bigram.signs, a.bigram.signs)


@pytest.mark.parametrize(
    ("changes", "key"),
    [({"bigram.rows": 1}, "bigram.rows"),
     ({"bigram.rows": 8, "bigram.dim": 33}, "bigram.dim"),
     ({"bigram.rows": 8, "bigram.dim": 0}, "bigram.dim"),
     ({"bigram.signs": 4}, "bigram.signs"),
     ({"bigram.rows": 8, "bigram.signs": -1}, "bigram.signs"),
     ({"bigram.in_x0": True}, "bigram.in_x0"),
     ({"bigram.lambda_init": math.nan}, "bigram.lambda_init")],
)  # fmt: skip
def test_bad_values_name_their_key(changes: dict, key: str) -> None:
    with pytest.raises(ValueError, match=re.escape(f"model.{key}")):
        update(BASE, changes).validate()
