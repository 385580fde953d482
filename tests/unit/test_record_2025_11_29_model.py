"""The 2025-11 record's model and loss options (docs/records.md, record_2025_11_29: C.1, C.2)
against its formulas.

`reference()` writes the forward pass out from C.1 with no module of the project: masks by
loops over positions, rotary from the formula, the gates, smear, skip, backout and the packed
scalars read by the record's indices, the merged qkvo read as the record's stored 768 × 3,072
matrix. Each option alone and all of them together (the record at 4 layers: record layers
0, 4, 7, 11) must give the model's logits and gradients in float64.
"""

import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from model import GPT, ModelConfig
from model.config import update
from model.plan import layer_plan
from stages import StageTable
from tests.helpers import stage_table

EOT = 50256
BASE = ModelConfig(n_layer=4, n_head=2, n_embd=32)
# The record's windows by stage (its train.stages), which YaRN's tables follow
RECORD_STAGES = stage_table([3, 7, 11], window_after=13, window_final_eval=20)
RECORD_2025_11_29 = update(
    ModelConfig(n_layer=12, n_head=6, n_embd=768, init_std=0.5),
    {
        "attention.rope": "half_truncated",
        "attention.rope_bf16": True,
        "attention.scale": 0.1,
        "residual.x0_shortcut": True,
        "residual.x0_mix_a_init": 1.1,
        "embed.value_embeds": ".12......012",
        "attention.layers": ".AAAAAA.AAAA",
        "mlp.layers": ".MMMMMMMMMMM",
        "attention.window": "SSSSLSSSSSSL",
        "attention.window_granularity": "token",
        "attention.document_mask": True,
        "head.softcap_form": "sigmoid",
        "attention.merged_qkvo": True,
        "mlp.fc_in_out": True,
        "attention.gate": True,
        "embed.smear": True,
        "residual.skips": [[4, 7]],
        "residual.backout_layer": 8,
        "numerics.packed_scalars": True,
        "numerics.dtype": "bf16",
        "head.bf16": True,
        "head.fp8": True,
        "numerics.fp8_scales": "sqrt_d_over_448",
        "attention.yarn": True,
        "head.reduction": "sum",
        "head.loss_dtype": "bf16",
    },
)
# At 4 layers (record layers 0, 4, 7, 11): 4 -> 7 is 1 -> 2, and record layer 8 is nearest 7.
TOY = update(
    RECORD_2025_11_29,
    {
        "n_layer": 4,
        "n_head": 2,
        "n_embd": 32,
        "attention.window_block": 8,
        "residual.skips": [[1, 2]],
        "residual.backout_layer": 2,
        "numerics.dtype": "fp32",
        "head.bf16": False,
        "head.fp8": False,
    },
)
# The same plan written per layer, which is what `reference` reads.
TOY_4 = update(
    TOY,
    {
        "embed.value_embeds": "...2",
        "attention.layers": ".A.A",
        "mlp.layers": ".MMM",
        "attention.window": "SLSL",
    },
)


def norm(z: torch.Tensor) -> torch.Tensor:
    return z / torch.sqrt(z.square().mean(-1, keepdim=True) + torch.finfo(z.dtype).eps)


def yarn_steps(cfg: ModelConfig, stages: StageTable, stage: int | None) -> list[tuple[int, int]]:
    """The window changes (W₀, W₁) in tokens up to `stage`, by the stage table `stages`."""
    windows = [n * cfg.attention.window_block for n in stages.long_windows]
    return list(itertools.pairwise(windows))[: stage or 0]


def frequencies(model: GPT, cfg: ModelConfig, stages: StageTable, stage: int | None) -> Tensor:
    """ω from C.1 step 3 (half-truncated: 1024^(−j/(D/4 − 1)), then zeros) and YaRN's C.4
    steps, in float64; checked against the model's fp32 table, whose values are then used
    (the angles of an fp32 table in float64, as the float64 model computes them)."""
    D, q = cfg.head_dim, cfg.head_dim // 4
    j = torch.arange(D // 2, dtype=torch.float64)
    if cfg.attention.rope == "half_truncated":
        omega = torch.where(j < q, 1024.0 ** (-j / (q - 1)), 0.0)
    else:
        omega = cfg.attention.rope_base ** (-j / (D // 2))
    table = model.rotary.inv_freq
    for w0, w1 in yarn_steps(cfg, stages, stage):
        gamma = ((w0 * omega / (2 * math.pi) - 1) / 31).clamp(0, 1)
        omega = omega * (w0 / w1 + gamma * (1 - w0 / w1))
        table = model.rotary.stage_freqs[stage]
    torch.testing.assert_close(table.double(), omega, rtol=1e-6, atol=0)
    return table.double()


def rotate(z: torch.Tensor, omega: torch.Tensor, bf16: bool) -> torch.Tensor:
    D = z.size(-1)
    angle = torch.arange(z.size(1), dtype=torch.float64)[:, None] * omega
    cos, sin = angle.cos()[None, :, None], angle.sin()[None, :, None]
    if bf16:  # tables stored in bf16
        cos, sin = cos.bfloat16().double(), sin.bfloat16().double()
    z1, z2 = z[..., : D // 2], z[..., D // 2 :]
    return torch.cat([z1 * cos + z2 * sin, -z1 * sin + z2 * cos], -1)


def allowed(idx: torch.Tensor, document: bool, w: int | None) -> torch.Tensor:
    """j ≤ i, same segment (a segment starts at each EOT), i − j ≤ W tokens; by loops."""
    B, T = idx.shape
    out = torch.zeros(B, T, T, dtype=torch.bool)
    for b in range(B):
        docs = [int((idx[b, : t + 1] == EOT).sum()) for t in range(T)]
        for i in range(T):
            for j in range(i + 1):
                out[b, i, j] = (docs[i] == docs[j] or not document) and (w is None or i - j <= w)
    return out


def reference(model: GPT, cfg: ModelConfig, idx: torch.Tensor, windows: dict, stage=None,
              stages: StageTable | None = None):  # fmt: skip
    """Logits by C.1's forward pass; `cfg`'s per-layer patterns have n_layer characters."""
    P, (B, T) = dict(model.named_parameters()), idx.shape
    n, H, D, d = cfg.n_layer, cfg.n_head, cfg.head_dim, cfg.n_embd
    s = P.get("scalars.packed")  # the record's indices (C.1 "Scalar vector")

    def scalar(name: str, layer: int = 0) -> torch.Tensor:
        if s is None:
            key = {"skip": "scalars.skip_gate", "smear": "scalars.smear_lambda",
                   "back": "scalars.backout_lambda", "x0": f"blocks.{layer}.x0_mix",
                   "vmix": f"blocks.{layer}.attn.value_mix"}  # fmt: skip
            return P[key[name]]
        at = {"skip": 1, "smear": 5 * n, "back": 5 * n + 1,
              "x0": slice(n + 2 * layer, n + 2 * layer + 2),
              "vmix": slice(3 * n + 2 * layer, 3 * n + 2 * layer + 2)}  # fmt: skip
        return s[at[name]]

    e = P["embed.weight"][idx]
    if cfg.embed.smear:  # e'_t = e_t + λ·σ(e_t[0:12]·wᵀ)·e_(t−1), t ≥ 1, per row
        rows = [e[:, 0]]
        for t in range(1, T):
            g = torch.sigmoid(e[:, t, :12] @ P["smear_gate.weight"][0])[:, None]
            rows.append(e[:, t] + scalar("smear") * g * e[:, t - 1])
        e = torch.stack(rows, 1)
    x = x0 = norm(e)
    masks = {
        k: allowed(idx, cfg.attention.document_mask, windows.get(k))
        for k in (None, "long", "short")
    }
    stages = stages or StageTable()
    omega = frequencies(model, cfg, stages, stage)
    scale = cfg.attention.scale or 1 / math.sqrt(D)
    for w0, w1 in yarn_steps(cfg, stages, stage):
        scale = scale * (1 + 0.2 * math.log(w1 / w0))
    outputs = []
    for layer in range(n):
        pre = f"blocks.{layer}."
        attn = not cfg.attention.layers or cfg.attention.layers[layer] == "A"
        mlp = not cfg.mlp.layers or cfg.mlp.layers[layer] == "M"
        for source, target in cfg.residual.skips:
            if layer == target:
                x = x + torch.sigmoid(scalar("skip")) * outputs[source]
        if cfg.residual.x0_shortcut and (attn or mlp):
            a, b = scalar("x0", layer)
            x = a * x + b * x0
        if attn:
            u = norm(x)
            if (
                cfg.attention.merged_qkvo
            ):  # the record's stored (d, 4d): matrix i = rows d/4·i … d/4·(i+1)
                stored = P[pre + "attn.qkvo"].reshape(d, 4 * d)
                wq, wk, wv, wo = (
                    stored[i * d // 4 : (i + 1) * d // 4].reshape(d, d) for i in range(4)
                )
            else:
                wq, wk, wv, wo = (P[pre + f"attn.{m}.weight"] for m in "qkvo")
            q, k, v = ((u @ w.T).view(B, T, H, D) for w in (wq, wk, wv))
            if cfg.embed.value_embeds:
                alpha, beta = scalar("vmix", layer)
                ve = cfg.embed.value_embeds[layer]
                v = alpha * v + (beta * P[f"value_embeds.{ve}.weight"][idx].view(B, T, H, D)
                                 if ve != "." else 0)  # fmt: skip
            q = rotate(norm(q), omega, cfg.attention.rope_bf16)
            k = rotate(norm(k), omega, cfg.attention.rope_bf16)
            scores = torch.einsum("bihd,bjhd->bhij", q, k) * scale
            kind = (
                None
                if not cfg.attention.window
                else {"L": "long", "S": "short"}[cfg.attention.window[layer]]
            )
            scores = scores.masked_fill(~masks[kind][:, None], -math.inf)
            y = torch.einsum("bhij,bjhd->bihd", scores.softmax(-1), v)
            if cfg.attention.gate:  # y_h ← y_h·σ(u[0:12]·G[h]ᵀ)
                y = y * torch.sigmoid(u[..., :12] @ P[pre + "attn.gate.weight"].T)[..., None]
            x = x + y.reshape(B, T, d) @ wo.T
        if mlp:
            fc = P[pre + "mlp.fc.weight"]
            hidden = norm(x) @ (fc if cfg.mlp.fc_in_out else fc.T)
            x = x + F.relu(hidden).square() @ P[pre + "mlp.proj.weight"].T
        outputs.append(x)
    if cfg.residual.backout_layer >= 0:
        x = x - scalar("back") * outputs[cfg.residual.backout_layer]
    z = norm(x) @ P["lm_head.weight"].T
    if cfg.head.softcap_form == "sigmoid":  # C.2: 30·σ(z/7.5)
        assert cfg.head.softcap == 30
        return 30 * torch.sigmoid(z / 7.5)
    return cfg.head.softcap * torch.tanh(z / cfg.head.softcap)


def randomised(cfg: ModelConfig, stages: StageTable | None = None, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    model = GPT(cfg, stages).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.5 if p.ndim >= 2 else 0.3) + (p.ndim < 2) * 0.5)
    return model


def tokens(B: int = 2, T: int = 24) -> torch.Tensor:
    idx = torch.randint(0, 50257, (B, T), generator=torch.Generator().manual_seed(1))
    idx[0, [0, 7, 15]] = EOT  # segments of several lengths, one row starting mid-document
    idx[1, [11]] = EOT
    return idx


TOKENS = {
    "attention.window_granularity": "token",
    "attention.window": "LSLS",
    "attention.window_tokens": 8,
}
PACKED = {
    "numerics.packed_scalars": True,
    "residual.x0_shortcut": True,
    "embed.value_embeds": "0..1",
    "embed.smear": True,
    "residual.skips": [[1, 3]],
    "residual.backout_layer": 2,
}
YARN = {
    "attention.rope": "half_truncated",
    "attention.rope_bf16": True,
    "attention.scale": 0.1,
    "attention.yarn": True,
    "attention.window": "LLLL",
    "attention.window_granularity": "token",
    "attention.window_block": 1,
}
CASES = {  # (model config, window tokens (long, short), YaRN stage, stage table)
    "record_2025_11_29 at 4 layers": (TOY, (5, 2), 2, RECORD_STAGES),
    "empty block 0": (
        update(
            BASE, {"mlp.layers": ".MMM", "attention.layers": ".AAA", "residual.x0_shortcut": True}
        ),
    ),
    "merged qkvo": (update(BASE, {"attention.merged_qkvo": True}),),
    "C_fc (in, out)": (update(BASE, {"mlp.fc_in_out": True}),),
    "attention gate": (update(BASE, {"attention.gate": True}),),
    "smear": (update(BASE, {"embed.smear": True}),),
    "gated skip": (update(BASE, {"residual.skips": [[0, 2]]}),),
    "backout": (update(BASE, {"residual.backout_layer": 1}),),
    "packed scalars": (update(BASE, PACKED),),
    "token windows": (update(BASE, {"attention.document_mask": True, **TOKENS}), (3, 1)),
    "yarn": (update(BASE, YARN), (16, 0), 1, stage_table([4, 9], window_after=16)),
}


# The CPU's bf16 decides the rotary tables of these: CI reruns them emulated.
BF16 = {"record_2025_11_29 at 4 layers", "yarn"}


@pytest.mark.parametrize(
    "name", [pytest.param(c, marks=[pytest.mark.cpu_bf16] * (c in BF16)) for c in CASES]
)
def test_forward_and_gradients_match_the_formulas(name: str) -> None:
    cfg, window, stage, stages = (*CASES[name], None, None, None)[:4]
    per_layer = TOY_4 if cfg is TOY else cfg
    model = randomised(cfg, stages)
    idx = tokens()
    args, windows = {}, {}
    if window:
        windows = {"long": window[0], "short": window[1]}
        args = {"window_tokens": torch.tensor(window[0] + 0.5),  # the mask takes ⌊W⌋
                "short_window_tokens": torch.tensor(float(window[1]))}  # fmt: skip
    if stage is not None:
        args["yarn_stage"] = torch.tensor(stage)
    got = model(idx, **args)
    want = reference(model, per_layer, idx, windows, stage, stages)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    params = list(model.parameters())
    g_got = torch.autograd.grad(got.square().mean(), params, allow_unused=True)
    g_want = torch.autograd.grad(want.square().mean(), params, allow_unused=True)
    for (pname, _), a, b in zip(model.named_parameters(), g_got, g_want, strict=True):
        assert (a is None) == (b is None), pname
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-10, msg=pname)
    if cfg.numerics.packed_scalars:  # entries nothing reads never move
        names = [p for p, _ in model.named_parameters()]
        n, used = cfg.n_layer, g_got[names.index("scalars.packed")] != 0
        assert not used[[0, *range(2, n)]].any() and not used[5 * n + 2 :].any()
        assert used[1] and used[5 * n] and used[5 * n + 1]


def test_the_record_at_4_layers_is_its_layers_0_4_7_11() -> None:
    assert layer_plan(TOY) == layer_plan(TOY_4)
    plan = [(s.attention, s.mlp, s.window, s.value_embed) for s in layer_plan(RECORD_2025_11_29)]
    assert plan[:3] == [(False, False, "short", None), (True, True, "short", 1),
                        (True, True, "short", 2)]  # fmt: skip
