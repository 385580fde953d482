"""record_2026_07_17's paired-head attention (docs/records.md D.1 Attn_ℓ step 5, D.10 item 1)
against the record's rules, written per head and token in float64 (no doubled tensor):

    head h of token t is rotated at position 2t if h is even, 2t+1 if h is odd; it sits at
    kernel position 2t in slot h if h < H/2, else at 2t+1 in slot h − H/2 (record: 3 slots,
    position 2t carries heads 0, 1, 2 and 2t+1 heads 3, 4, 5; q, k, v and aux alike). A query
    attends causally over kernel positions to the keys of its slot, within its token's
    document, with the window W counted in kernel positions; outputs return to their heads.

Each query (h, t) below lists its keys (h', t') by those rules. Negative controls: pairs of
adjacent heads (the #58 README's reading), every head rotated at 2t, the window in tokens,
and the rotation phase equal to the kernel position.
"""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig
from model.attention import CausalSelfAttention, build_attention
from model.config import update
from model.context import Context
from model.flops import training_flops
from model.masks import EOT, build_masks, paired_key
from model.plan import describe_plan, layer_plan
from model.points import Points
from model.rotary import Rotary
from model.scalars import Scalars
from tests.reference import norm

D, T, W = 12, 12, 5  # head dim (3 rotating pairs), tokens, window in doubled positions
RECORD = "P.P..P...P."
WRONG = ("adjacent", "no offset", "token window", "kernel phase")


def config(H: int = 6, n_layer: int = 1, paired: str = "P", rope: str = "interleaved_half"):
    return update(ModelConfig(n_layer=n_layer, n_head=H, n_embd=H * D), {
        "attention.paired": paired, "attention.rope": rope, "attention.gate": True,
        "attention.document_mask": True, "attention.window": "L" * n_layer,
        "attention.window_tokens": W, "attention.window_granularity": "token",
        "embed.value_embeds": "0" + "." * (n_layer - 1), "embed.value_gate": True,
    })  # fmt: skip


def omegas(rope: str) -> torch.Tensor:
    """The frequencies of the rotating pairs. interleaved_half: 1024^(−j/(D/4−1)), j < D/4, =
    1, 2⁻⁵, 2⁻¹⁰ for D = 12 (exact in fp32); full: 10000^(−i/(D/2)) in fp32 (the model's
    table)."""
    if rope == "interleaved_half":
        return torch.tensor([1024.0 ** (-j / (D // 4 - 1)) for j in range(D // 4)]).double()
    return (10000 ** (-torch.arange(D // 2).float() / (D // 2))).double()


def rotate(z: torch.Tensor, phase: torch.Tensor, rope: str) -> torch.Tensor:
    """z (B, T, H, D) rotated by angle phase[t, h]·ω: interleaved_half on pairs (2j, 2j+1),
    j < D/4 (the rest static); full on pairs (i, i + D/2)."""
    angle = phase[..., None] * omegas(rope)  # (T, H, pairs)
    cos, sin = angle.cos(), angle.sin()
    if rope == "interleaved_half":
        a, b = z[..., 0 : D // 2 : 2], z[..., 1 : D // 2 : 2]
        turned = torch.stack((a * cos + b * sin, b * cos - a * sin), -1).flatten(-2)
        return torch.cat([turned, z[..., D // 2 :]], -1)
    a, b = z[..., : D // 2], z[..., D // 2 :]
    return torch.cat([a * cos + b * sin, -a * sin + b * cos], -1)


def spec_attention(q, k, v, docs, paired: bool, rope: str, variant: str = "spec"):
    """softmax over each query's keys, per head h and token t; q, k, v (B, T, H, D) before
    rotary, `docs` (B, T) document ids. A normal layer: keys (h, t') with t' ≤ t, same
    document, t − t' ≤ W, rotated at t."""
    H = q.size(2)
    half = H // 2

    def slot(h: int) -> int:  # which heads attend together
        if not paired:
            return h
        return h // 2 if variant == "adjacent" else h % half

    def place(h: int, t: int) -> int:  # the kernel position: 2t or 2t+1
        if not paired:
            return t
        return 2 * t + (h % 2 if variant == "adjacent" else h // half)

    def phase(h: int, t: int) -> int:
        if not paired:
            return t
        if variant == "kernel phase":
            return place(h, t)
        return 2 * t + (0 if variant == "no offset" else h % 2)

    phases = torch.tensor([[phase(h, t) for h in range(H)] for t in range(T)], dtype=torch.float64)
    q, k = rotate(q, phases, rope), rotate(k, phases, rope)
    y = torch.zeros_like(q)
    for h in range(H):
        for t in range(T):
            keys = [
                (h2, t2)
                for h2 in range(H)
                for t2 in range(T)
                if slot(h2) == slot(h)
                and place(h2, t2) <= place(h, t)
                and (t - t2 if variant == "token window" else place(h, t) - place(h2, t2)) <= W
            ]
            hs, ts = torch.tensor(keys).T
            scores = torch.einsum("bd,bnd->bn", q[:, t, h], k[:, ts, hs]) / math.sqrt(D)
            scores = scores.masked_fill(docs[:, ts] != docs[:, t, None], -math.inf)
            y[:, t, h] = torch.einsum("bn,bnd->bd", scores.softmax(-1), v[:, ts, hs])
    return y


def spec_layer(P: dict, pre: str, u, idx, paired: bool, rope: str, variant="spec", ve=None):
    """Attn_ℓ(u): QK-norm, value embedding gated per head (`ve`: the lookup, default table 0's
    rows of `idx`), attention, output gate, W_o."""
    B, _, C = u.shape
    H = C // D
    q, k, v = ((u @ P[pre + f"attn.{n}.weight"].T).view(B, T, H, D) for n in "qkv")
    if pre + "attn.value_gate.weight" in P:  # aux_h = 2σ([u[0:6], ve[0:6]]·G[h]ᵀ)·ve_h
        ve = P["value_embeds.0.weight"][idx] if ve is None else ve
        gate = 2 * torch.sigmoid(
            torch.cat([u[..., :6], ve[..., :6]], -1) @ P[pre + "attn.value_gate.weight"].T
        )
        v = v + gate[..., None] * ve.view(B, T, H, D)
    docs = (idx == EOT).cumsum(-1)
    y = spec_attention(norm(q), norm(k), v, docs, paired, rope, variant)
    y = y * torch.sigmoid(u[..., :12] @ P[pre + "attn.gate.weight"].T)[..., None]
    return y.reshape(B, T, C) @ P[pre + "attn.o.weight"].T


def spec_model(model: GPT, idx, variant: str = "spec"):
    P = dict(model.named_parameters())
    for layer, spec in enumerate(model.plan):  # the value gates are rows of value_gates.weight
        if spec.value_slot is not None:
            P[f"blocks.{layer}.attn.value_gate.weight"] = P["value_gates.weight"][spec.value_slot]
    x = norm(P["embed.weight"][idx])
    for layer, spec in enumerate(model.plan):
        pre = f"blocks.{layer}."
        x = x + spec_layer(P, pre, norm(x), idx, spec.paired, "interleaved_half", variant)
        x = x + F.relu(norm(x) @ P[pre + "mlp.fc.weight"].T).square() @ P[pre + "mlp.proj.weight"].T
    c = model.cfg.head.softcap
    return c * torch.tanh(norm(x) @ P["lm_head.weight"].T / c)


def randomised(cfg: ModelConfig) -> GPT:
    torch.manual_seed(0)
    model = GPT(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model


def tokens() -> torch.Tensor:
    """Two rows with document starts (EOT) at 0 and 5, and at 8."""
    idx = torch.randint(0, 50000, (2, T), generator=torch.Generator().manual_seed(1))
    idx[0, [0, 5]] = EOT
    idx[1, 8] = EOT
    return idx


def kernel_mask(mask) -> torch.Tensor:
    """What a block-sparse kernel computes under a FlexAttention BlockMask, (B, Q, KV): every
    element of its full tiles, the mask function's elements of its partial tiles."""
    (Q, KV), (bq, bk) = mask.seq_lengths, mask.BLOCK_SIZE
    B = mask.kv_num_blocks.size(0)
    b, q, kv = torch.arange(B)[:, None, None], torch.arange(Q)[:, None], torch.arange(KV)
    rule = mask.mask_mod(b, torch.zeros(()), q, kv).expand(B, Q, KV)
    out = torch.zeros(B, Q, KV, dtype=torch.bool)
    for num, ids, full in ((mask.kv_num_blocks, mask.kv_indices, False),
                           (mask.full_kv_num_blocks, mask.full_kv_indices, True)):  # fmt: skip
        for r in range(B):
            for i in range(num.size(-1)):
                for j in ids[r, 0, i, : num[r, 0, i]].tolist():
                    rows, cols = slice(i * bq, (i + 1) * bq), slice(j * bk, (j + 1) * bk)
                    out[r, rows, cols] = True if full else rule[r, rows, cols]
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def layer(cfg: ModelConfig) -> tuple[CausalSelfAttention, Rotary]:
    """One paired attention layer (random weights) and the model's rotary, without the tables."""
    torch.manual_seed(0)
    attn = build_attention(cfg, layer_plan(cfg)[0], 0).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return attn, Rotary(D, mode=cfg.attention.rope).double()


@pytest.mark.parametrize(
    ("H", "rope"), [(6, "interleaved_half"), (6, "full"), (4, "interleaved_half")]
)
def test_the_layer_is_the_spec(H: int, rope: str) -> None:
    cfg = config(H, rope=rope)
    attn, rotary = layer(cfg)
    idx, gen = tokens(), torch.Generator().manual_seed(2)
    u = norm(torch.randn(2, T, H * D, dtype=torch.float64, generator=gen)).requires_grad_(True)
    ve = torch.randn(2, T, H * D, dtype=torch.float64, generator=gen).requires_grad_(True)
    masks = build_masks(
        idx, True, set(), torch.tensor(W), 128, "sdpa", True, paired=frozenset({"long"})
    )
    assert set(masks) == {paired_key("long")}
    gates = (torch.randn(1, H, 12, dtype=torch.float64, generator=gen) * 0.5).requires_grad_()
    points = Points(Scalars(cfg), value_gates=SimpleNamespace(weight=gates))
    got = attn(u, rotary, Context(None, {0: ve}, masks), points)
    P = {f"blocks.0.attn.{n}": p for n, p in attn.named_parameters()}
    P["blocks.0.attn.value_gate.weight"] = gates[0]
    want = spec_layer(P, "blocks.0.", u, idx, True, rope, ve=ve)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    inputs = [u, ve, gates, *attn.parameters()]
    g = torch.randn_like(got)
    for a, b in zip(
        torch.autograd.grad(got, inputs, g), torch.autograd.grad(want, inputs, g), strict=True
    ):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if H == 6 and rope == "interleaved_half":  # each misreading is far outside the tolerance
        for variant in WRONG:
            wrong = spec_layer(P, "blocks.0.", u, idx, True, rope, variant, ve)
            assert rel(wrong, got) > 1e-3, variant


def test_a_model_with_a_paired_layer_is_the_spec() -> None:
    model = randomised(config(n_layer=2, paired="P."))
    idx = tokens()
    got = model(idx, window_tokens=torch.tensor(float(W)))
    want = spec_model(model, idx)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    params = [p for _, p in model.named_parameters()]
    targets = idx.roll(-1, 1)
    g_got = torch.autograd.grad(F.cross_entropy(got.flatten(0, 1), targets.flatten()), params)
    g_want = torch.autograd.grad(F.cross_entropy(want.flatten(0, 1), targets.flatten()), params)
    for (name, _), a, b in zip(model.named_parameters(), g_got, g_want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13, msg=name)
    for variant in WRONG:
        assert rel(spec_model(model, idx, variant), got) > 1e-3, variant


@pytest.mark.parametrize("granularity", ["token", "block"])
def test_the_doubled_masks_sdpa_and_flex(granularity: str) -> None:
    """Kernel positions i, j < 2T: j ≤ i, token ⌊i/2⌋'s document = token ⌊j/2⌋'s, and the
    window in kernel positions: i − j ≤ W (token), ⌊i/b⌋ − ⌊j/b⌋ ≤ N − 1 (block)."""
    idx, block = tokens(), 4
    docs = (idx == EOT).cumsum(-1)
    i, j = torch.arange(2 * T)[:, None], torch.arange(2 * T)[None, :]
    n = torch.tensor(W if granularity == "token" else 3)
    window = i - j <= W if granularity == "token" else i // block - j // block <= 3 - 1
    want = (j <= i) & window & (docs[:, i // 2] == docs[:, j // 2])
    token = granularity == "token"
    for impl in ("sdpa", "flex"):
        masks = build_masks(
            idx, True, {"short"}, n * 2, block, impl, token, n, frozenset({"short"})
        )
        got = masks[paired_key("short")]
        got = got[:, 0] if impl == "sdpa" else kernel_mask(got)
        assert torch.equal(got, want), impl
        assert got.shape[-1] == 2 * T and masks["short"].shape[-1] == T


def test_off_builds_nothing_and_on_adds_no_parameter() -> None:
    base = config(paired="")
    for pattern in ("", "."):
        plan = layer_plan(update(base, {"attention.paired": pattern}))
        assert not any(s.paired for s in plan) and "paired" not in describe_plan(plan)
    idx, window = tokens(), torch.tensor(W)
    assert set(build_masks(idx, True, {"long"}, window, 128, "sdpa", True)) == {"long"}
    on, off = layer(config()), layer(base)
    assert [n for n, _ in on[0].named_parameters()] == [n for n, _ in off[0].named_parameters()]
    assert describe_plan(layer_plan(config())) == "0: attn long paired ve0"


def test_the_record_pattern_and_the_errors() -> None:
    cfg = update(ModelConfig(n_layer=11, n_head=6, n_embd=72), {"attention.paired": RECORD})
    assert [i for i, s in enumerate(layer_plan(cfg)) if s.paired] == [0, 2, 5, 9]
    with pytest.raises(ValueError, match=r"even model\.n_head.*got 3"):
        update(ModelConfig(n_head=3, n_embd=48), {"attention.paired": "P..."}).validate()
    with pytest.raises(ValueError, match=r"model\.attention\.paired"):
        update(ModelConfig(), {"attention.paired": "PX"}).validate()
    with pytest.raises(ValueError, match=r"layer 1 is paired \(model\.attention\.paired\)"):
        layer_plan(update(ModelConfig(), {"attention.paired": ".P..", "attention.xsa": ".X.."}))
    with pytest.raises(ValueError, match=r"model\.attention\.paired"):
        layer(config())[0].track_max_logit = True


def test_flops_count_the_doubled_pairs_at_half_width() -> None:
    """12·d·P for the normal layers' pairs P, 12·(d/2)·P₂ for a paired layer's P₂ over 2T."""
    cfg, idx, w = config(n_layer=2, paired="P."), tokens(), torch.tensor(W)
    masks = build_masks(idx, True, {"long"}, w, 128, "sdpa", True, paired=frozenset({"long"}))
    normal, doubled = masks["long"].sum().item(), masks[paired_key("long")].sum().item()
    d = cfg.n_embd
    assert training_flops(idx, cfg, 0, w).item() == 12 * d * normal + 6 * d * doubled
