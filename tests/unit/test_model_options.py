"""The records' model options against direct formulas (docs/records.md), on CPU.

`reference()` below writes the forward pass out from the formulas, with no module of the
model: plain tensor algebra on the model's own parameters, its own rotary and its own
attention mask (built by looping over positions). Each option combination must give the
model's logits and gradients in float64.
"""

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.config import update
from model.head import FP8Matmul
from model.masks import EOT, block_mask, dense_mask, document_ids, tile_structure
from model.plan import layer_plan, resample
from model.window_schedule import window_at
from optim import partition_params

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

BASE = ModelConfig(n_layer=4, n_head=2, n_embd=32)
RECORD_2024_11_06 = update(BASE, {"init_std": 1 / math.sqrt(3), "attention.rope_bf16": True,
                         "attention.value_residual": "learned",
                         "residual.x0_shortcut": True})  # fmt: skip
RECORD_2025_01_26 = update(BASE, {
    "embed.rows": 50257, "init_std": 0.5, "attention.rope": "half_truncated",
    "attention.merged_qkv": True, "attention.scale": 0.12, "residual.x0_shortcut": True,
    "residual.unet": True, "embed.value_embeds": "012......012",
    "attention.layers": "AAAAAAA.AAAA", "attention.window": "LSSSLSSLSSSL",
    "attention.window_block": 8, "attention.window_tokens": 64,
    "attention.document_mask": True, "head.softcap_form": "sigmoid",
})  # fmt: skip


def norm(z: torch.Tensor) -> torch.Tensor:
    return z / torch.sqrt(z.square().mean(-1, keepdim=True) + torch.finfo(z.dtype).eps)


def rotate(z: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """RECORDS' rotary: z¹ <- z¹cos + z²sin, z² <- −z¹sin + z²cos with θ_j per the variant."""
    D = z.size(-1)
    j = torch.arange(D // 2, dtype=torch.float64)
    if cfg.attention.rope == "half_truncated":
        q = D // 4
        # 1024^(−j/(q−1)) for j < q, geometric from 1 to 1/1024 (evaluated in fp32 as a
        # geometric sequence, the record's way), then q zeros
        theta = torch.cat([(1 / 1024) ** torch.linspace(0, 1, q), torch.zeros(q)]).double()
        assert torch.allclose(theta[:q], 1024.0 ** (-j[:q] / (q - 1)), rtol=1e-6)
    else:
        theta = cfg.attention.rope_base ** (-j.float() / (D // 2))  # θ_j = base^(−j/(D/2)), in fp32
    # The frequencies in fp32; the angles in the model's precision (float64 here, fp32 in a
    # real run), the tables bf16-rounded for the 2024-11 record.
    angle = torch.arange(z.size(1), dtype=torch.float64)[:, None] * theta.float().double()
    cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
    if cfg.attention.rope_bf16:
        cos, sin = cos.bfloat16().double(), sin.bfloat16().double()
    z1, z2 = z[..., : D // 2], z[..., D // 2 :]
    return torch.cat([z1 * cos + z2 * sin, -z1 * sin + z2 * cos], -1)


def allowed(idx: torch.Tensor, cfg: ModelConfig, n: int | None) -> torch.Tensor:
    """The mask by definition: j <= i, same document, within n blocks (loops, no masks.py)."""
    B, T = idx.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        doc, docs = 0, []
        for t in range(T):
            doc += int(idx[b, t] == EOT)
            docs.append(doc)
        for i in range(T):
            for j in range(i + 1):
                same = docs[i] == docs[j] or not cfg.attention.document_mask
                near = (
                    n is None
                    or i // cfg.attention.window_block - j // cfg.attention.window_block
                    <= max(n, 1) - 1
                )
                out[b, i, j] = same and near
    return out


def reference(model: GPT, idx: torch.Tensor, window_blocks: int | None = None) -> torch.Tensor:
    cfg, P = model.cfg, dict(model.named_parameters())
    H, D = cfg.n_head, cfg.head_dim
    B, T = idx.shape
    x = x0 = norm(P["embed.weight"][idx])
    ve = {int(k): P[f"value_embeds.{k}.weight"][idx] for k in model.value_embeds or {}}
    lengths = (
        {"long": window_blocks, "short": max(1, max(window_blocks, 1) // 2)}
        if window_blocks
        else {}
    )
    stack, v1, skips = [], None, 0
    for layer, spec in enumerate(layer_plan(cfg)):
        pre = f"blocks.{layer}."
        if spec.skip_from is not None:  # U-net: the i-th skip pops the stack, weight w_i
            x = x + P["skips.weights"][skips] * stack[spec.skip_from]
            skips += 1
        if cfg.residual.x0_shortcut:
            a, b = P[pre + "x0_mix"]
            x = a * x + b * x0
        if spec.attention:
            u = norm(x)
            if cfg.attention.merged_qkv:
                wq, wk, wv = P[pre + "attn.qkv"]
            else:
                wq, wk, wv = (P[pre + f"attn.{n}.weight"] for n in "qkv")
            q, k, v = (u @ w.T for w in (wq, wk, wv))
            if cfg.attention.value_residual != "off":
                v1 = v if v1 is None else v1
                lam = (
                    P[pre + "attn.value_lambda"]
                    if cfg.attention.value_residual == "learned"
                    else cfg.attention.value_residual_lambda
                )
                v = (1 - lam) * v + lam * v1
            if cfg.embed.value_embeds:
                alpha, beta = P[pre + "attn.value_mix"]
                v = alpha * v + (beta * ve[spec.value_embed] if spec.value_embed is not None else 0)
            heads = lambda t: t.view(B, T, H, D)  # noqa: E731
            q, k, v = heads(q), heads(k), heads(v)
            q, k = rotate(norm(q), cfg), rotate(norm(k), cfg)
            scale = cfg.attention.scale or 1 / math.sqrt(D)
            scores = torch.einsum("bihd,bjhd->bhij", q, k) * scale
            ok = allowed(idx, cfg, lengths.get(spec.window))
            scores = scores.masked_fill(~ok[:, None], float("-inf"))
            y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v).reshape(B, T, H * D)
            x = x + y @ P[pre + "attn.o.weight"].T
        hidden = F.relu(norm(x) @ P[pre + "mlp.fc.weight"].T).square()
        x = x + hidden @ P[pre + "mlp.proj.weight"].T
        stack.append(x)
    z = norm(x) @ P["lm_head.weight"].T
    c = cfg.head.softcap
    return (
        c * torch.sigmoid(z / (c / 4))
        if cfg.head.softcap_form == "sigmoid"
        else c * torch.tanh(z / c)
    )


def randomised(cfg: ModelConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim >= 2 else 0.3) + (p.ndim < 2) * 0.5)
    return model


def tokens(B: int = 2, T: int = 40, seed: int = 1) -> torch.Tensor:
    idx = torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(seed))
    idx[0, [0, 9, 22]] = EOT  # documents of several lengths, one row starting mid-document
    idx[1, [17]] = EOT
    return idx


CASES = {
    "record_2024_11_06 options": RECORD_2024_11_06,
    "value residual, fixed": update(BASE, {"attention.value_residual": "fixed"}),
    "record_2025_01_26 options": RECORD_2025_01_26,
    "document mask, no window": update(BASE, {"attention.document_mask": True}),
    "window, no document mask": update(
        BASE, {"attention.window": "LS", "attention.window_block": 4, "attention.window_tokens": 8}
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_forward_and_gradients_match_the_formulas(name: str) -> None:
    cfg = CASES[name]
    model = randomised(cfg)
    idx = tokens()
    n = 3 if cfg.attention.window else None
    args = (
        {"window_tokens": torch.tensor(n * cfg.attention.window_block - 1.5, dtype=torch.float64)}
        if n
        else {}
    )
    got = model(idx, **args)
    want = reference(model, idx, n)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    params = [p for p in model.parameters()]
    g_got = torch.autograd.grad(got.square().mean(), params, allow_unused=True)
    g_want = torch.autograd.grad(
        reference(model, idx, n).square().mean(), params, allow_unused=True
    )
    for (pname, _), a, b in zip(model.named_parameters(), g_got, g_want, strict=True):
        assert (a is None) == (b is None), pname
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10, msg=pname)


def test_merged_qkv_is_the_three_matrices_stacked() -> None:
    merged = randomised(update(BASE, {"attention.merged_qkv": True}))
    separate = GPT(BASE).double()
    with torch.no_grad():
        for name, p in separate.named_parameters():
            if name.endswith(("attn.q.weight", "attn.k.weight", "attn.v.weight")):
                block, which = name.split(".attn.")
                p.copy_(dict(merged.named_parameters())[f"{block}.attn.qkv"]["qkv".index(which[0])])
            else:
                p.copy_(dict(merged.named_parameters())[name])
    idx = tokens()
    torch.testing.assert_close(merged(idx), separate(idx), rtol=1e-12, atol=1e-12)


def test_the_dense_mask_is_the_rule() -> None:
    cfg = update(BASE, {"attention.document_mask": True, "attention.window_block": 4})
    idx = tokens(T=30)
    for n in (1, 2, 5):
        got = dense_mask(document_ids(idx), 30, torch.tensor(n), 4, idx.device)[:, 0]
        assert torch.equal(got, allowed(idx, cfg, n)), n


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_attention_block_mask_equals_the_dense_mask() -> None:
    """FlexAttention (forward; its CPU backward is not implemented) against masked SDPA."""
    from model.attend import attend

    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50257, (2, 256), generator=gen)
    idx[0, [0, 70, 200]] = EOT
    idx[1, [128, 129]] = EOT
    q, k, v = (torch.randn(2, 2, 256, 32, generator=gen) for _ in range(3))
    docs = document_ids(idx)
    for n in (1, 2, 3):
        dense = dense_mask(docs, 256, torch.tensor(n), 64, idx.device)
        flex = block_mask(tile_structure(docs, 256, 64, idx.device), 256, torch.tensor(n), 64)
        torch.testing.assert_close(attend(q, k, v, flex, 0.12), attend(q, k, v, dense, 0.12),
                                   rtol=1e-5, atol=1e-5)  # fmt: skip


def test_window_schedule_is_the_records_table() -> None:
    """N(s) = max(1, ⌈9s/1180⌉) blocks for every step, and docs/records.md's first steps (B.4)."""
    blocks = [math.ceil(window_at(s, 1770, 1728) / 128) for s in range(1771)]
    assert blocks == [max(1, math.ceil(9 * s / 1180)) for s in range(1771)]
    firsts = [blocks.index(n) for n in range(1, 15)]
    assert firsts == [0, 132, 263, 394, 525, 656, 787, 918, 1049, 1181, 1312, 1443, 1574, 1705]
    assert blocks[1770] == 14  # the final validation


def test_layer_plan_is_the_records_table_and_scales_down() -> None:
    full = replace(RECORD_2025_01_26, n_layer=12)
    plan = layer_plan(full)
    assert [s.attention for s in plan] == [i != 7 for i in range(12)]
    assert [s.window for s in plan if s.attention] == ["long", "short", "short", "short", "long",
                                                        "short", "short", "short", "short",
                                                        "short", "long"]  # fmt: skip
    assert [s.value_embed for s in plan] == [0, 1, 2, None, None, None, None, None, None, 0, 1, 2]
    assert [s.skip_from for s in plan] == [None] * 6 + [5, 4, 3, 2, 1, 0]
    assert resample("LSSSLSSLSSSL", 4) == "LLLL"  # record layers 0, 4, 7, 11
    small = layer_plan(RECORD_2025_01_26)
    assert [(s.attention, s.value_embed, s.skip_from) for s in small] == [
        (True, 0, None), (True, None, None), (False, None, 1), (True, 2, 0)]  # fmt: skip
    assert layer_plan(replace(RECORD_2025_01_26, n_layer=1))[0].attention


def test_records_parameter_counts_and_groups() -> None:
    """docs/records.md's counts: 162,201,636 (A, 36 scalars) and 275,598,388 (B, 52 scalars)."""
    a = replace(RECORD_2024_11_06, n_layer=12, n_head=6, n_embd=768)
    b = update(
        RECORD_2025_01_26,
        {
            "n_layer": 12,
            "n_head": 6,
            "n_embd": 768,
            "attention.window_block": 128,
            "numerics.dtype": "bf16",
            "head.fp8": True,
        },
    )
    for cfg, total, scalars, muon in ((a, 162_201_636, 36, 72), (b, 275_598_388, 52, 46)):
        with torch.device("meta"):
            model = GPT(cfg)
        assert sum(p.numel() for p in model.parameters()) == total
        assert sum(p.numel() for p in model.parameters() if p.ndim <= 1) == scalars
        groups = partition_params(model, "muon_adamw")
        assert len(groups["muon"]) == muon
    assert [n for n, _ in groups["embed"]] == ["embed.weight"] + [
        f"value_embeds.{i}.weight" for i in range(3)]  # fmt: skip
    assert (
        model.embed.weight.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.float32
    )


def test_options_off_build_the_same_parameters() -> None:
    torch.manual_seed(0)
    plain = GPT(BASE)
    assert [n for n, _ in plain.named_parameters()][:3] == [
        "embed.weight", "blocks.0.attn.q.weight", "blocks.0.attn.k.weight"]  # fmt: skip
    assert not any(p.ndim < 2 for p in plain.parameters())


def test_sigmoid_softcap_loss_equals_the_half_tanh_cap() -> None:
    """30·σ(z/7.5) = 15·tanh(z/15) + 15: the same softmax, so the same loss (fused and plain)."""
    model = randomised(update(BASE, {"head.softcap_form": "sigmoid"})).float()
    idx = tokens()
    fused = model(idx, idx.roll(-1, 1))
    model.cfg = update(model.cfg, {"head.loss": "plain"})
    plain = model(idx, idx.roll(-1, 1))
    model.cfg = update(model.cfg, {"head.softcap_form": "tanh", "head.softcap": 15.0})
    half = model(idx, idx.roll(-1, 1))
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(half, plain, rtol=1e-5, atol=1e-5)


def test_fp8_head_is_the_scaled_quantised_product() -> None:
    """Forward and backward against the formula written out (dequantised FP8 in fp32), and
    against the bf16 head it replaces."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(64, 96, generator=gen)).bfloat16().requires_grad_()
    w = (torch.randn(256, 96, generator=gen) * 0.05).requires_grad_()
    out = FP8Matmul.apply(x, w)
    g = torch.randn(64, 256, generator=gen).bfloat16() * 1e-4
    out.backward(g)
    x8 = (x.detach() * 2).to(torch.float8_e4m3fn).float()
    w8 = (w.detach() * 512).to(torch.float8_e4m3fn).float()
    g8 = (g * 2**19).to(torch.float8_e5m2).float()
    torch.testing.assert_close(out, (x8 @ w8.T / 1024).bfloat16(), rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(x.grad, (g8 @ w8 / 2**28).bfloat16(), rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(w.grad, g8.T @ x8 / 2**20, rtol=1e-4, atol=1e-9)
    exact = x.detach().float() @ w.detach().T
    assert (out.float() - exact).norm() / exact.norm() < 0.1  # FP8 costs a few percent
    x.grad = None
    bf16 = x @ w.detach().bfloat16().T
    bf16.backward(g)
    rel = (out.float() - bf16.float()).norm() / bf16.float().norm()
    assert rel < 0.1


def test_fp8_head_only_while_training() -> None:
    torch.manual_seed(0)
    model = GPT(update(BASE, {"numerics.dtype": "bf16", "head.fp8": True, "head.loss": "plain"}))
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.05)  # in FP8 range once scaled by 512
    assert model.embed.weight.dtype == torch.bfloat16
    idx = tokens()
    model.eval()
    evaluated = model(idx)
    model.train()
    trained = model(idx)
    assert not torch.equal(evaluated, trained)  # FP8 in training, bf16 in evaluation
    rel = (trained - evaluated).norm() / evaluated.norm()
    assert 0 < rel < 0.1
