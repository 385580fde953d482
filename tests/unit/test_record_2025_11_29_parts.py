"""The 2025-11 record's model (docs/records.md, record_2025_11_29: C.1, C.2): its parameter count,
initial values, losses, YaRN table, token-window FLOPs and config checks. (The forward pass
against the record's formulas: test_record_2025_11_29_model.py.)"""

import math

import pytest
import torch
import torch.nn.functional as F

from model import GPT
from model.config import update
from model.flops import training_flops
from model.forward_schedule import check_stages
from model.head import FP8Matmul
from model.loss import model_loss
from optim.partition import param_roles
from stages import StageTable
from tests.unit.test_record_2025_11_29_model import (
    BASE,
    EOT,
    RECORD_2025_11_29,
    RECORD_STAGES,
    TOKENS,
    TOY,
    tokens,
)

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16


def test_record_2025_11_29_parameters() -> None:
    """C.1: 268,665,628 parameters in 49 tensors, their shapes, dtypes and optimizer roles."""
    with torch.device("meta"):
        model = GPT(RECORD_2025_11_29, RECORD_STAGES)
    named = dict(model.named_parameters())
    assert sum(p.numel() for p in named.values()) == 268_665_628 and len(named) == 49
    roles = {r: [n for n, _ in ps] for r, ps in param_roles(model).items()}
    assert roles["embed"] == ["embed.weight"] + [f"value_embeds.{i}.weight" for i in range(3)]
    assert roles["head"] == ["lm_head.weight"] and roles["scalar"] == ["scalars.packed"]
    assert len(roles["matrix"]) == 43  # 10 qkvo, 11 C_fc, 11 C_proj, 10 gates, w_smear
    shapes = {n: (tuple(p.shape), p.dtype) for n, p in named.items()}
    f32, b16 = torch.float32, torch.bfloat16
    assert shapes["blocks.1.attn.qkvo"] == ((4, 768, 768), f32)
    assert (
        shapes["blocks.1.mlp.fc.weight"] == shapes["blocks.1.mlp.proj.weight"] == ((768, 3072), f32)
    )
    assert shapes["blocks.1.attn.gate.weight"] == ((6, 12), b16)
    assert shapes["smear_gate.weight"] == ((1, 12), b16)
    assert shapes["scalars.packed"] == ((64,), f32)
    assert shapes["lm_head.weight"] == ((50304, 768), b16)
    assert not any(n.startswith(("blocks.0.", "blocks.7.attn")) for n in named)


def test_record_2025_11_29_initial_values() -> None:
    torch.manual_seed(0)
    model = GPT(update(TOY, {"numerics.dtype": "bf16", "head.bf16": True}), RECORD_STAGES)
    n, bound = 4, math.sqrt(3) * 0.5 / math.sqrt(32)
    want = [-1.5] * n + [1.1, 0.0] * n + [0.5] * 2 * n + [0.0, 0.5] + [1.0] * 2
    packed = model.scalars.packed
    assert packed.tolist() == pytest.approx(want) and packed.dtype == torch.float32
    for i in (1, 3):
        qkvo = model.blocks[i].attn.qkvo
        assert qkvo[:3].abs().max() <= bound and qkvo[:3].std() > 0.5 * bound and not qkvo[3].any()
        assert not model.blocks[i].attn.gate.weight.any()
        assert model.blocks[i].attn.gate.weight.dtype == torch.bfloat16
    for i in (1, 2, 3):
        assert model.blocks[i].mlp.fc.weight.abs().max() <= bound
        assert not model.blocks[i].mlp.proj.weight.any()
    assert not model.smear_gate.weight.any() and model.smear_gate.weight.dtype == torch.bfloat16
    assert not model.lm_head.weight.any() and model.lm_head.weight.dtype == torch.bfloat16
    unpacked = GPT(
        update(
            TOY, {"numerics.packed_scalars": False, "numerics.dtype": "bf16", "head.bf16": True}
        ),
        RECORD_STAGES,
    )
    own = unpacked.scalars
    assert own.skip_gate.item() == -1.5 and own.backout_lambda.item() == 0.5
    assert unpacked.scalars.smear_lambda.item() == 0 and unpacked.blocks[
        1
    ].x0_mix.tolist() == pytest.approx([1.1, 0])
    assert not hasattr(unpacked.blocks[0], "x0_mix")  # the empty block has nothing


def test_loss_sum_in_training_mean_in_evaluation() -> None:
    """With the zero head every logit is capped to 15: the loss is ln(50304) per token."""
    model = GPT(update(TOY, {"head.loss_dtype": "fp32"}), RECORD_STAGES)
    idx = tokens()
    args = {"window_tokens": torch.tensor(5.0), "short_window_tokens": torch.tensor(2.0)}
    assert model(idx, idx, **args).item() == pytest.approx(idx.numel() * math.log(50304))
    model.eval()
    assert model(idx, idx, **args).item() == pytest.approx(math.log(50304))
    logits = torch.randn(48, 50304, generator=torch.Generator().manual_seed(0)) * 5
    y = idx.flatten()
    want = F.cross_entropy(30 * torch.sigmoid(logits / 7.5), y, reduction="sum")
    plain = update(
        BASE, {"head.loss": "plain", "head.reduction": "sum", "head.softcap_form": "sigmoid"}
    )
    for cfg in (plain, update(plain, {"head.loss": "fused"})):  # the fused path sums as well
        torch.testing.assert_close(model_loss(logits[None], y[None], cfg.head, True), want)


def test_bf16_loss_caps_in_bf16() -> None:
    """Training: cap and cross-entropy on bf16; evaluation: cap in bf16, fp32 cross-entropy."""
    z = (torch.randn(1, 48, 50304, generator=torch.Generator().manual_seed(0)) * 20).bfloat16()
    y = tokens().flatten()[None]
    cfg = update(
        BASE, {"head.softcap_form": "sigmoid", "head.loss_dtype": "bf16", "head.reduction": "sum"}
    )
    capped = 30 * torch.sigmoid(z / 7.5)  # each op rounds to bf16
    assert capped.dtype == torch.bfloat16
    trained = model_loss(z, y, cfg.head, True)
    assert trained.dtype == torch.bfloat16
    assert trained == F.cross_entropy(capped[0], y[0], reduction="sum")
    evaluated = model_loss(z, y, cfg.head, False)
    assert evaluated.dtype == torch.float32
    assert evaluated == F.cross_entropy(capped[0].float(), y[0])
    assert evaluated != F.cross_entropy(30 * torch.sigmoid(z[0].float() / 7.5), y[0])
    with pytest.raises(ValueError, match=r"model\.head\.loss"):
        update(cfg, {"head.loss": "fused"}).validate()


def test_fp8_head_takes_a_bf16_weight() -> None:
    x = torch.randn(16, 32).bfloat16().requires_grad_()
    w = (torch.randn(64, 32) * 0.05).bfloat16().requires_grad_()
    (FP8Matmul.apply(x, w).float() * 1e-5).sum().backward()  # e5m2 range once scaled by 2¹⁹
    assert w.grad.dtype == torch.bfloat16 and w.grad.abs().sum() > 0


def test_token_window_flops_worked_by_hand() -> None:
    """T = 6, W = 2 tokens (3 keys at most), EOT at 3: keys 1 2 3 1 2 3 = 12; W = 0: 6."""
    idx = torch.zeros(1, 6, dtype=torch.long)
    idx[0, 3] = EOT
    cfg = update(BASE, {"n_layer": 2, "attention.document_mask": True, **TOKENS})
    got = training_flops(idx, cfg, 0, torch.tensor(2.0), torch.tensor(0.0))
    assert got.item() == 12 * 32 * (12 + 6)


@pytest.mark.parametrize("change", [
    {"mlp.layers": "MX.."}, {"attention.merged_qkvo": True, "attention.merged_qkv": True},
    {"residual.skips": [[2, 1]]}, {"residual.backout_layer": 4},
    {"head.bf16": True}, {"attention.window_granularity": "token"}, {"attention.yarn": True},
    {"numerics.packed_scalars": True, "residual.unet": True},
])  # fmt: skip
def test_bad_record_2025_11_29_options_name_the_key(change: dict) -> None:
    with pytest.raises(ValueError, match=rf"model\.{next(iter(change))}"):
        cfg = update(BASE, change)
        cfg.validate()
        check_stages(cfg, StageTable())  # the model's keys against a run without stages
