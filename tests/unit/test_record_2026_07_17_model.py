"""record_2026_07_17's whole model (docs/records.md D.1, D.2) against the float64 reference that
follows the record's description alone (tests/record_2026_07_17_reference.py, which imports nothing
of the project): the record's 11-layer table and the same table resampled to 8 layers, at a toy
width (6 heads of 16), every parameter random so that every mechanism matters. Logits to 1e-9, and
every parameter's gradient of the multi-token loss (its autograd form) to 1e-7. The reference's
misreadings (no x0 quirk, adjacent head pairs, record_2025_11_29's rotary pairing) are far outside
those tolerances. The FP8 MLP, the FP8 head and the record's loss form are roundings, tested against
their formulas with explicit casts (test_record_2026_07_17_fp8_mlp.py, _mtp.py)."""

import pytest
import torch
from omegaconf import OmegaConf

from model import GPT, ModelConfig
from model.config import update
from model.mlp_fp8 import delayed_states
from tests import record_2026_07_17_reference as ref
from tests.helpers import CONF_DIR, dotted, stage_table
from trainer.checkpoint.upgrade import rename_key

H, D, BOS, T = 6, 16, 50256, 24
SHORT, LONG, SCALE = 3, 7, 0.5
MTP = [1.0, 0.5, 0.2]  # stage 1's weights (its last one mid-decay): t+1, t+2, t+3

PRESET = CONF_DIR / "model" / "record_2026_07.yaml"


# The record's model as its preset composes it (conf/model/record_2026_07.yaml), at toy width
# and with its roundings off (bf16, the FP8 MLP and head and the record's loss form: tested
# against their formulas elsewhere), the plain autograd form of the multi-token loss, one
# fixed attention scale and token windows given to the forward.
TOY = {
    "n_embd": H * D, "compile": False, "attention.rope_bf16": False, "attention.scale": SCALE,
    "attention.yarn": False,
    "bigram.rows": 97, "bigram.dim": 8, "bigram.signs": 16,
    "residual.mudd_hidden": 8, "mlp.fp8": "off", "head.fp8": False, "head.bf16": False,
    "head.loss": "plain", "head.loss_dtype": "fp32", "numerics.dtype": "fp32",
    "numerics.bf16_matrices": False,
}  # fmt: skip
RECORD_2026_07_17 = dotted(OmegaConf.to_container(OmegaConf.load(PRESET))) | TOY

# The 11-layer table resampled to 8 layers (model/plan.py: record layers 0 1 3 4 6 7 9 10), with
# the layer indices the resampled table puts the skip and c₇ at.
EIGHT = {"n_layer": 8, "residual.skips": [[2, 4]],
         "residual.attn_input_layer": 5}  # fmt: skip
SHAPES = {
    11: ref.ModelShape(),
    8: ref.ModelShape(n_layer=8, attention="AAAA.AAA", paired="P.....P.", window="SSLSSSSL",
                        key_offset="..K....K", xsa=".XXX.X.X", value_table=".0....34",
                        skip_from=2, skip_to=4, c7=5),
}  # fmt: skip


ONE_STAGE = stage_table([1])  # windows by stage (the forward takes the step's width)
# The experiment's windows by stage (its train.stages), which YaRN's tables follow
RECORD_WINDOWS = stage_table([3, 7, 11], window_after=13, window_final_eval=20)


def config(n_layer: int) -> ModelConfig:
    changes = RECORD_2026_07_17 if n_layer == 11 else {**RECORD_2026_07_17, **EIGHT}
    return update(ModelConfig(), changes)


def shape(n_layer: int) -> ref.ModelShape:
    s = SHAPES[n_layer]
    s.head_dim, s.vocab, s.bigram_rows, s.bigram_dim = D, 50304, 97, 8
    s.sign_rows, s.mudd_hidden = 16, 8
    return s


def randomised(cfg: ModelConfig) -> GPT:
    """The model in float64 with every parameter random and non-zero (signs as they are)."""
    torch.manual_seed(0)
    model = GPT(cfg, ONE_STAGE).double().train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.5 if p.dim() <= 1 or name.startswith("mudd") else 0.3
            p.copy_(p + torch.randn_like(p) * scale)
    return model


def record_params(model: GPT) -> dict[str, torch.Tensor]:
    """The model's parameters under the reference's names (views: gradients flow back)."""
    P = dict(model.named_parameters())
    out = {"E": P["embed.weight"], "W_head": P["lm_head.weight"], "Bg": P["bigram.embed.weight"],
           "S": model.bigram.signs, "smear_gate": P["smear_gate.weight"],
           "skip_gate": P["skips.token_gate.weight"],
           "scalars": P["scalars.packed"][: 2 * model.cfg.n_layer + 2]}  # fmt: skip
    for name in ("resid_lambdas", "post_lambdas", "x0_lambdas", "bigram_lambdas", "xsa_alphas",
                 "mudd_w1", "mudd_w2", "mudd_b2"):  # the record's names, naming 1's  # fmt: skip
        out[name] = P[rename_key(name)]
    out |= {f"VE.{t}": table.weight for t, table in model.value_embeds.items()}
    for layer, (block, spec) in enumerate(zip(model.blocks, model.plan, strict=True)):
        if block.attn is not None:
            w = block.attn.qkvo
            out |= {f"W_{n}.{layer}": w[i] for i, n in enumerate("qkvo")}
            out[f"attn_gate.{layer}"] = block.attn.gate.weight
        if spec.value_slot is not None:
            out[f"ve_gate.{layer}"] = model.value_gates.weight[spec.value_slot]
        out[f"c_fc.{layer}"], out[f"c_proj.{layer}"] = block.mlp.fc.weight, block.mlp.proj.weight
    return out


def tokens() -> torch.Tensor:
    """Two rows: a piece before the first document start, documents of 1 and several tokens."""
    idx = torch.randint(0, 50257, (2, T), generator=torch.Generator().manual_seed(1))
    idx[0, [3, 9, 10]] = BOS
    idx[1, [0, 15]] = BOS
    return idx


def reference(model: GPT, idx: torch.Tensor, n_layer: int, **kw) -> tuple:
    omega = model.rotary.inv_freq[: D // 4].double()  # the model's fp32-computed frequencies
    return ref.forward(
        record_params(model), idx, shape(n_layer), window_short=SHORT, window_long=LONG,
        attn_scale=SCALE, bos=BOS, rope_omega=omega, **kw,
    )  # fmt: skip


def ours(model: GPT, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
    windows = {"window_tokens": torch.tensor(float(LONG)),
               "short_window_tokens": torch.tensor(float(SHORT)),
               "mtp_weights": torch.tensor(MTP, dtype=torch.float64)}  # fmt: skip
    return model(idx, targets, **windows)


@pytest.fixture(autouse=True)
def float64_epsilon(monkeypatch: pytest.MonkeyPatch) -> None:
    """The RMSNorm ε is the stream dtype's machine epsilon (model/layers.py): the record's
    2⁻²³ in fp32 and bf16, 2⁻⁵² in this float64 check; the reference takes the same."""
    monkeypatch.setattr(ref, "EPS", torch.finfo(torch.float64).eps)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("n_layer", [11, 8])
def test_the_whole_model_is_the_reference(n_layer: int) -> None:
    model = randomised(config(n_layer))
    idx = tokens()
    targets = idx.roll(-1, 1)
    got = ours(model, idx)
    want, _ = reference(model, idx, n_layer, mtp_weights=None)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    names, params = zip(*model.named_parameters(), strict=True)
    loss_got = ours(model, idx, targets)
    _, loss_want = reference(model, idx, n_layer, mtp_weights=MTP, targets=targets)
    torch.testing.assert_close(loss_got, loss_want, rtol=1e-11, atol=0)
    g_got = torch.autograd.grad(loss_got, params)
    g_want = torch.autograd.grad(loss_want, params, allow_unused=True)
    for name, a, b in zip(names, g_got, g_want, strict=True):
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7 * b.abs().max(), msg=name)
    if n_layer == 11:  # each misreading moves the logits by far more than the tolerance
        for kw in ({"x0_quirk": False}, {"paired_pairing": "adjacent"},
                   {"rope_pairing": "half"}):  # fmt: skip
            wrong, _ = reference(model, idx, n_layer, mtp_weights=None, **kw)
            assert rel(wrong, got) > 1e-4, kw


FP32 = {"scalars.packed", "sublayer_scales.resid_lambdas", "sublayer_scales.post_lambdas",
        "x0_injection.lambdas", "bigram.lambdas", "xsa.alphas"}  # fmt: skip


def test_the_records_shape_has_its_parameter_count_and_dtypes() -> None:
    """The preset at the record's shape (on the meta device): 490,908,680 trainable values,
    the record's 498,773,000 less its 7,864,320 padding entries (qk_bank[60:64], vo_bank[20:24],
    mlp_bank[11]), which only divide its banks over 8 ranks; bf16 but the fp32 lambdas."""
    preset = dotted(OmegaConf.to_container(OmegaConf.load(PRESET)))
    cfg = update(ModelConfig(), preset | {"compile": False})
    with torch.device("meta"):
        model = GPT(cfg, RECORD_WINDOWS)
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values()) == 490_908_680 == 498_773_000 - 7_864_320
    banks = {  # the record's tensors, as this model holds them
        "qk_bank[0:60] + vo_bank[0:20]": sum(b.attn.qkvo.numel() for b in model.blocks if b.attn),
        "mlp_bank[0:11]": sum(b.mlp.fc.weight.numel() + b.mlp.proj.weight.numel()
                              for b in model.blocks),
        "attn_gate_bank": sum(b.attn.gate.weight.numel() for b in model.blocks if b.attn),
        "ve_gate_bank": params["value_gates.weight"].numel(),
        "bigram.embed": params["bigram.embed.weight"].numel(),
    }  # fmt: skip
    assert banks == {"qk_bank[0:60] + vo_bank[0:20]": 60 * 256 * 768 + 20 * 768 * 768,
                     "mlp_bank[0:11]": 11 * 2 * 3072 * 768, "attn_gate_bank": 720,
                     "ve_gate_bank": 360, "bigram.embed": 144_875_520}  # fmt: skip
    for name, p in params.items():
        assert p.dtype == (torch.float32 if name in FP32 else torch.bfloat16), name
    assert model.bigram.signs.shape == (8192, 192)  # a buffer: not trained, not counted


def test_the_preset_takes_a_training_step_with_its_roundings() -> None:
    """The preset as it runs (bf16, the FP8 MLP and head, the record's loss form and MTP) at
    toy width: a training step gives a finite loss and reaches every parameter but the never
    read row of the MUDD layer's value gate; evaluation is next-token mean cross-entropy."""
    toy = {"n_embd": H * D, "compile": False, "bigram.rows": 97, "bigram.dim": 8,
           "bigram.signs": 16, "residual.mudd_hidden": 8}  # fmt: skip
    torch.manual_seed(0)
    preset = dotted(OmegaConf.to_container(OmegaConf.load(PRESET)))
    model = GPT(update(ModelConfig(), preset | toy), RECORD_WINDOWS)
    idx = tokens()
    windows = {"window_tokens": torch.tensor(384.0), "short_window_tokens": torch.tensor(128.0)}
    mtp = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    model.micro_steps = 2  # every layer's FP8 MLP, the MUDD layer's too, keeps 2 slots
    loss = model(idx, idx.roll(-1, 1), **windows, mtp_weights=mtp)
    loss.backward()
    states = delayed_states(model.blocks)
    assert len(states) == 11 and all(s.act_max.numel() == 2 for s in states.values())
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert model.value_gates.weight.grad[-1].abs().max() == 0  # layer 10's gate is MUDD's
    model.eval()
    with torch.no_grad():
        val = model(idx, idx.roll(-1, 1), **windows)
    assert 10 < val.item() < 12  # ≈ ln(50304) = 10.83 from the N(0, 0.005²) head
