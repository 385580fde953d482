"""QK-clip (optim/qk_clip.py) on CPU: tracked max logits against scale·q·kᵀ written out, the
clip rule on separate and merged weights, forward untouched, FSDP2 shards against one process."""

import math

import pytest
import torch

from model import GPT, ModelConfig, attention, max_logit
from model.config import update
from model.masks import EOT, block_mask, dense_mask, document_ids, tile_structure
from optim.qk_clip import QKClip

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

BASE = ModelConfig(n_layer=2, n_head=3, n_embd=48)  # 3 heads of 16
# 5 heads of 8 rows: heads straddle the shard boundaries of W_q, W_k on 2 ranks (20 + 20 rows)
# and on 3 (14 + 14 + 12); the merged 3×d×d weight splits 2 + 1, or one slice per rank.
SHARDED = ModelConfig(n_layer=2, n_head=5, n_embd=40)
MASKED = update(
    BASE,
    {
        "attention.window": "LS",
        "attention.window_block": 4,
        "attention.window_tokens": 8,
        "attention.document_mask": True,
        "attention.scale": 0.12,
    },
)
WINDOW = {"window_tokens": torch.tensor(7.0)}  # 2 blocks of 4 for long layers, 1 for short


def build(cfg: ModelConfig, out_std: float = 0.2) -> GPT:
    """A model whose attention outputs reach the next layer (out_std 0: they do not)."""
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.o.weight.normal_(0.0, out_std)
    return model


def tokens(seed: int, B: int = 2, T: int = 40) -> torch.Tensor:
    idx = torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(seed))
    idx[0, [0, 9, 22]] = EOT
    idx[1, 17] = EOT
    return idx


def args(cfg: ModelConfig) -> dict:
    return WINDOW if cfg.attention.window else {}


def maxima(model: GPT) -> torch.Tensor:
    return torch.stack([block.attn.max_logit for block in model.blocks])


def between(m: torch.Tensor) -> float:
    """A tau halfway between two recorded maxima: half the heads above it, half below."""
    s = m.flatten().sort().values
    return float(s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def direct_max(q: torch.Tensor, k: torch.Tensor, mask, scale: float | None) -> torch.Tensor:
    """max over allowed (b, i, j) of scale·q_i·k_j per head, materialised in float64."""
    T, D = q.shape[-2:]
    logits = torch.einsum("bhid,bhjd->bhij", q.double(), k.double()) * (scale or D**-0.5)
    ok = torch.ones(T, T, dtype=torch.bool).tril() if mask is None else mask
    return logits.masked_fill(~ok, float("-inf")).amax(dim=(0, 2, 3))


def spy_attend(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Record what every attention layer hands `attend`: its q, k, mask and scale."""
    calls, real = [], attention.attend

    def spy(q, k, v, mask, scale):
        calls.append((q.detach(), k.detach(), mask, scale))
        return real(q, k, v, mask, scale)

    monkeypatch.setattr(attention, "attend", spy)
    return calls


CASES = {
    "causal": BASE,
    "document and window masks": MASKED,
    "merged qkv, no QK-norm": update(
        BASE, {"attention.merged_qkv": True, "attention.qk_norm": False}
    ),
}


@pytest.mark.parametrize("chunk_rows", [None, 3])
@pytest.mark.parametrize("name", CASES)
def test_tracked_max_is_the_masked_logits_max(
    name: str, chunk_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = CASES[name]
    model = build(cfg)
    idx = tokens(1)
    if chunk_rows:  # queries in chunks of 3 rows, each over its band of keys only
        monkeypatch.setattr(max_logit, "TRACK_CHUNK", idx.numel() * cfg.n_head * chunk_rows)
    QKClip(model, 1.0).start()
    calls = spy_attend(monkeypatch)
    model(idx, **args(cfg))
    assert len(calls) == cfg.n_layer
    for block, (q, k, mask, scale) in zip(model.blocks, calls, strict=True):
        got = block.attn.max_logit
        assert got.dtype == torch.float32 and got.shape == (cfg.n_head,)
        # An fp32 result against an fp64 reference: fp32's tolerance (the order of a dot
        # product's sum is the CPU's, so a bound near fp32's epsilon holds on one kind only).
        torch.testing.assert_close(got, direct_max(q, k, mask, scale).float())


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_block_mask_is_tracked_as_its_dense_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 50257, (2, 64), generator=gen)
    idx[0, [0, 20, 41]] = EOT
    idx[1, 33] = EOT
    q, k = (torch.randn(2, 3, 64, 16, generator=gen) for _ in range(2))
    docs, n = document_ids(idx), torch.tensor(2)
    dense = dense_mask(docs, 64, n, 16, idx.device)
    flex = block_mask(tile_structure(docs, 64, 16, idx.device), 64, n, 16)
    want = direct_max(q, k, dense, 0.12).float()
    monkeypatch.setattr(max_logit, "TRACK_CHUNK", 2 * 3 * 64 * 5)
    torch.testing.assert_close(max_logit.max_logits(q, k, flex, 0.12), want)
    torch.testing.assert_close(max_logit.max_logits(q, k, dense, 0.12), want)


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("kind", ["causal", "dense", "block"])
def test_every_allowed_pair_counts_and_no_other(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head h holds one logit of 1 at its pair (i, j), zeros elsewhere: its max is 1 exactly
    when the mask allows (i, j), whatever chunk and key band (i, j) falls in."""
    T = 16
    idx = torch.zeros(1, T, dtype=torch.long)
    idx[0, 6] = EOT
    pairs = [(i, j) for i in range(T) for j in range(T)]
    q, k = torch.zeros(2, 1, len(pairs), T, 2)
    for h, (i, j) in enumerate(pairs):
        q[0, h, i, 0], k[0, h, j, 0] = 1.0, 1.0
    docs, n = document_ids(idx), torch.tensor(2)
    masks = {"causal": None, "dense": dense_mask(docs, T, n, 4, idx.device),
             "block": block_mask(tile_structure(docs, T, 4, idx.device), T, n, 4)}  # fmt: skip
    ok = torch.ones(T, T).tril() if kind == "causal" else masks["dense"][0, 0].float()
    monkeypatch.setattr(max_logit, "TRACK_CHUNK", len(pairs) * T * 3)
    got = max_logit.max_logits(q, k, masks[kind], 1.0)
    assert torch.equal(got, torch.stack([ok[i, j] for i, j in pairs]))


def qk_rows(model: GPT) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(W_q, W_k) of every layer, cloned, from separate or merged weights."""
    if model.cfg.attention.merged_qkv:
        return [(b.attn.qkv[0].clone(), b.attn.qkv[1].clone()) for b in model.blocks]
    return [(b.attn.q.weight.clone(), b.attn.k.weight.clone()) for b in model.blocks]


@pytest.mark.parametrize("merged", [False, True])
def test_apply_scales_exactly_the_heads_over_tau(merged: bool) -> None:
    model = build(update(BASE, {"attention.merged_qkv": merged}))
    clip = QKClip(model, 1.0)
    clip.start()
    model(tokens(1))
    m = maxima(model)
    clip.tau = tau = between(m)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    weights = qk_rows(model)
    stats = clip.apply()
    assert stats == {"qk_clip/max_logit": m.max().item(), "qk_clip/clipped_heads": 3}
    D = BASE.head_dim
    for layer, (old, new) in enumerate(zip(weights, qk_rows(model), strict=True)):
        for h in range(BASE.n_head):
            rows = slice(h * D, (h + 1) * D)
            for w0, w1 in zip(old, new, strict=True):
                if m[layer, h] > tau:
                    want = w0[rows] * math.sqrt(tau / m[layer, h].item())
                    torch.testing.assert_close(w1[rows], want, rtol=1e-6, atol=0)
                else:
                    assert torch.equal(w1[rows], w0[rows])
    for name, p in model.named_parameters():  # nothing else moves: v, o, MLP, embeddings
        if not name.endswith(("attn.q.weight", "attn.k.weight", "attn.qkv")):
            assert torch.equal(p, before[name]), name
        elif name.endswith("attn.qkv"):
            assert torch.equal(p[2], before[name][2]), name
    assert torch.equal(maxima(model), torch.full((2, 3), float("-inf")))


@pytest.mark.parametrize("qk_norm", [False, True])
def test_clipped_heads_reach_tau_only_without_qk_norm(qk_norm: bool) -> None:
    """Same batch before and after the clip (zero output projections keep the layers apart):
    without QK-norm a clipped head's max logit becomes tau; with it, nothing changes, since
    the norm divides out the scale of W_q and W_k."""
    model = build(
        update(BASE, {"attention.merged_qkv": True, "attention.qk_norm": qk_norm}), out_std=0.0
    )
    clip = QKClip(model, 1.0)
    clip.start()
    idx = tokens(2)
    model(idx)
    m = maxima(model)
    clip.tau = tau = between(m)
    assert clip.apply()["qk_clip/clipped_heads"] == 3
    model(idx)
    after = maxima(model)
    want = torch.where(m > tau, torch.full_like(m, tau), m) if not qk_norm else m
    torch.testing.assert_close(after, want, rtol=1e-5, atol=1e-6)


def test_forward_is_untouched_and_micro_batches_take_the_max(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, a, b = build(MASKED), tokens(1), tokens(2)
    plain = model(a, **WINDOW)
    clip = QKClip(model, 1.0)
    clip.start()
    assert torch.equal(model(a, **WINDOW), plain)  # tracking reads q and k, changes nothing
    only_a = maxima(model)
    clip.reset()
    model(b, **WINDOW)
    only_b = maxima(model)
    clip.reset()
    model(a, **WINDOW)
    model(b, **WINDOW)
    assert torch.equal(maxima(model), torch.maximum(only_a, only_b))
    assert (only_a != only_b).any()

    def untracked(*_: object) -> None:
        raise AssertionError("max logits computed while tracking is off")

    monkeypatch.setattr(attention, "max_logits", untracked)
    model.eval()  # evaluation passes are not recorded even with tracking on
    assert torch.equal(model(a, **WINDOW), plain)
    model.train()
    clip.stop()
    assert torch.equal(model(a, **WINDOW), plain)


def test_bad_use_fails_clearly() -> None:
    model = build(BASE)
    with pytest.raises(ValueError, match="tau must be positive"):
        QKClip(model, 0.0)
    with pytest.raises(RuntimeError, match=r"start\(\)"):
        QKClip(model, 1.0).apply()


def test_a_run_with_qk_norm_is_warned_that_the_clip_bounds_nothing() -> None:
    """QK-norm makes the clip a no-op on the logits (test_clipped_heads_reach_tau_only_without
    _qk_norm): a run that asks for both is told at start, naming both keys; without either
    there is nothing to say."""
    from tests.helpers import compose_config
    from trainer.config import to_config
    from trainer.observe.console import qk_clip_without_effect

    def conf(*overrides: str):
        return to_config(compose_config([*overrides, "run_dir=."]))

    warning = qk_clip_without_effect(conf("optim.muon.qk_clip=50"))
    assert warning is not None and "model.attention.qk_norm=true" in warning
    assert "optim.muon.qk_clip=50" in warning and "\n" not in warning
    assert (
        qk_clip_without_effect(conf("optim.muon.qk_clip=50", "model.attention.qk_norm=false"))
        is None
    )
    assert qk_clip_without_effect(conf()) is None


def test_a_head_subset_clips_only_its_heads() -> None:
    """optim.muon.qk_clip_heads: of the heads over tau, exactly those named ("L" a whole layer,
    "L.h" one head) are scaled, by the same factor as with every head allowed; the rest keep
    their bits. A name that is no head of the model is refused when the clip is built."""
    model = build(BASE)
    heads = ["0", "1.2"]
    clip = QKClip(model, 1.0, heads=heads)
    clip.start()
    model(tokens(1))
    m = maxima(model)
    clip.tau = tau = between(m)
    weights = qk_rows(model)
    allowed = {(0, h) for h in range(BASE.n_head)} | {(1, 2)}
    stats = clip.apply()
    want_clipped = sum(1 for (layer, h) in allowed if m[layer, h] > tau)
    assert stats["qk_clip/max_logit"] == m.max().item()  # every head is still tracked
    assert stats["qk_clip/clipped_heads"] == want_clipped > 0
    D = BASE.head_dim
    for layer, (old, new) in enumerate(zip(weights, qk_rows(model), strict=True)):
        for h in range(BASE.n_head):
            rows = slice(h * D, (h + 1) * D)
            for w0, w1 in zip(old, new, strict=True):
                if m[layer, h] > tau and (layer, h) in allowed:
                    want = w0[rows] * math.sqrt(tau / m[layer, h].item())
                    torch.testing.assert_close(w1[rows], want, rtol=1e-6, atol=0)
                else:
                    assert torch.equal(w1[rows], w0[rows]), (layer, h)
    assert any(
        m[layer, h] > tau for layer in range(2) for h in range(3) if (layer, h) not in allowed
    )
    for bad in (["2"], ["0.3"], ["x"], ["1.-1"]):
        with pytest.raises(ValueError, match=r"optim\.muon\.qk_clip_heads: .* is not a head"):
            QKClip(model, 1.0, heads=bad)


def test_qk_clip_heads_need_the_clip() -> None:
    from optim.config import MuonConfig

    with pytest.raises(ValueError, match=r"optim\.muon\.qk_clip_heads is read only with"):
        MuonConfig(qk_clip_heads=["0"]).validate()
    MuonConfig(qk_clip=50.0, qk_clip_heads=["0", "3.1"]).validate()
