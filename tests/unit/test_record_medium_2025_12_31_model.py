"""record_medium_2025_12_31's whole model (docs/records.md M.1, M.2) against the float64 reference
that follows the record's description alone (tests/record_medium_2025_12_31_reference.py, which
imports nothing of the project): the record's 16-layer table and the same table resampled to 8
layers (with two skips ending at one layer), at a toy width (4 heads of 16), every parameter random
so that every mechanism matters. Logits to 1e-9, every parameter's gradient of the multi-token loss
to 1e-7, the evaluation loss to 1e-11. Four misreadings of the reference (record_2026_07_17's
key-offset channels, record_2026_07_17's value-gate input, the skips' sources reversed, no x02) move
the logits by far more than that. The tie: while it holds, the table is the head's copy (the
optimizer keeps it so, optim/tied.py), and the model is then the record's forward that reads the
head's rows, whatever the record's own unused E holds; the two tables' gradients sum to the record's
one tensor's. The bf16 roundings are the preset's, tested by its training step below and by their
formulas elsewhere (test_loss.py, test_record_medium_2025_12_31_optim.py)."""

import pytest
import torch
from omegaconf import OmegaConf

from model import GPT, ModelConfig
from model.config import update
from tests import record_medium_2025_12_31_reference as ref
from tests.helpers import CONF_DIR, dotted, stage_table

H, D, BOS, T = 4, 16, 50256, 24
SHORT, LONG, SCALE = 3, 7, 0.5
MTP = [1.0, 0.5, 0.2]  # stage 1's weights, its last one mid-decay: t+1, t+2, t+3

PRESET = CONF_DIR / "model" / "record_medium_2025_12.yaml"


# The record's model as its preset composes it, at toy width, with its roundings off (bf16
# weights and stream, bf16 rotary tables, the bf16 training cap), one fixed attention scale and
# token windows handed to the forward.
TOY = {
    "n_head": H, "n_embd": H * D, "compile": False, "attention.rope_bf16": False,
    "attention.scale": SCALE, "attention.yarn": False, "head.bf16": False,
    "head.loss_dtype": "fp32", "numerics.dtype": "fp32",
}  # fmt: skip
RECORD_MEDIUM_2025_12_31 = dotted(OmegaConf.to_container(OmegaConf.load(PRESET))) | TOY
# The 16-layer table resampled to 8 layers (model/plan.py: record layers 0 2 4 6 9 11 13 15):
# windows LSLSSLSL, tables 024..024; the skips chosen so that two end at one layer.
EIGHT = {"n_layer": 8, "residual.skips": [[3, 4], [2, 5], [1, 5]], "residual.backout_layer": 5}
SHAPES = {
    16: ref.ModelShape(head_dim=D, n_head=H),
    8: ref.ModelShape(n_layer=8, n_head=H, head_dim=D, window="LSLSSLSL",
                        value_table="024..024", skips=((3, 4), (2, 5), (1, 5)), backout_layer=5),
}  # fmt: skip


ONE_STAGE = stage_table([1])  # windows by stage (the forward takes the step's width)
RECORD_WINDOWS = stage_table([3, 7, 11, 13])  # the experiment's, which YaRN's tables follow


def config(n_layer: int) -> ModelConfig:
    changes = RECORD_MEDIUM_2025_12_31 if n_layer == 16 else {**RECORD_MEDIUM_2025_12_31, **EIGHT}
    return update(ModelConfig(), changes)


def randomised(cfg: ModelConfig) -> GPT:
    """The model in float64 with every parameter random and non-zero (signs as they are)."""
    torch.manual_seed(0)
    model = GPT(cfg, ONE_STAGE).double().train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(p + torch.randn_like(p) * (0.5 if p.dim() <= 1 or "lambdas" in name else 0.3))
    return model


def record_params(model: GPT) -> dict[str, torch.Tensor]:
    """The model's parameters under the record's own names and storage (views and reshapes:
    gradients flow back)."""
    P = dict(model.named_parameters())
    out = {name: P[name] for name in ("lm_head.weight", "embed.weight", "embed2.weight",
                                      "smear_gate.weight")}  # fmt: skip
    out |= {f"value_embeds.{t}.weight": table.weight for t, table in model.value_embeds.items()}
    gates = model.skips.token_gate.weight  # row k: skip k's 1 × G gate
    out |= {f"skip_gates.{k}.weight": row[None] for k, row in enumerate(gates)}
    out["x0_lambdas"] = P["x0_lambdas.lambdas"].reshape(-1)  # (n, 2) row-major: Λ[ℓ, 0], Λ[ℓ, 1]
    out["scalars"] = P["scalars.packed"]
    for layer, (block, spec) in enumerate(zip(model.blocks, model.plan, strict=True)):
        pre = f"blocks.{layer}."
        out[pre + "attn.qkvo_w"] = block.attn.qkvo.reshape(-1, H * D)  # [W_q; W_k; W_v; W_o]
        out[pre + "attn.attn_gate.weight"] = block.attn.gate.weight
        if spec.value_slot is not None:
            out[pre + "attn.value_embed_gate.weight"] = model.value_gates.weight[spec.value_slot]
        out[pre + "mlp.c_fc"], out[pre + "mlp.c_proj"] = block.mlp.fc.weight, block.mlp.proj.weight
    return out


def tokens() -> torch.Tensor:
    """Two rows: a piece before the first document start, documents of 1 and several tokens."""
    idx = torch.randint(0, 50257, (2, T), generator=torch.Generator().manual_seed(1))
    idx[0, [3, 9, 10]] = BOS
    idx[1, [0, 15]] = BOS
    return idx


def run_args(model: GPT) -> dict:
    return {"long_window": LONG, "short_window": SHORT, "attn_scale": SCALE,
            "freqs": model.rotary.inv_freq.double()}  # the model's fp32-computed ω  # fmt: skip


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


def assert_grads(names: tuple, got: tuple, want: tuple) -> None:
    for name, a, b in zip(names, got, want, strict=True):
        b = torch.zeros_like(a) if b is None else b
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-7 * b.abs().max(), msg=name)


@pytest.mark.parametrize("n_layer", [16, 8])
def test_the_whole_model_is_the_reference(n_layer: int) -> None:
    """After the split (the table E its own tensor): logits, the training loss and its
    gradients, the evaluation loss."""
    model = randomised(config(n_layer))
    idx, shape = tokens(), SHAPES[n_layer]
    targets = idx.roll(-1, 1)
    p, kw = record_params(model), run_args(model)
    got = ours(model, idx)
    want = ref.logits(p, idx, shape, tied=False, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    names, params = zip(*model.named_parameters(), strict=True)
    loss_got = ours(model, idx, targets)
    loss_want = ref.training_loss(p, idx, targets, MTP, shape, tied=False, **kw)
    torch.testing.assert_close(loss_got, loss_want, rtol=1e-11, atol=0)
    g_got = torch.autograd.grad(loss_got, params)
    assert_grads(names, g_got, torch.autograd.grad(loss_want, params, allow_unused=True))
    model.eval()
    with torch.no_grad():
        val = model(idx, targets, window_tokens=torch.tensor(float(LONG)),
                    short_window_tokens=torch.tensor(float(SHORT)))  # fmt: skip
    want_val = ref.eval_loss(p, idx, targets, shape, tied=False, **kw)
    torch.testing.assert_close(val, want_val, rtol=1e-11, atol=0)
    if n_layer == 16:  # each misreading moves the logits by far more than the tolerance
        for wrong in ("key_offset_second_half", "value_gate_reads_ve", "skips_reversed",
                      "no_x02"):  # fmt: skip
            other = ref.logits(p, idx, shape, tied=False, misreading=wrong, **kw)
            assert rel(other, got) > 1e-4, wrong


def test_while_tied_the_lookup_reads_the_heads_rows() -> None:
    """Before the split the table is the head's copy: the model computes the record's forward
    that reads W_head's rows, whatever the record's own (never read) E holds, and the table's
    and the head's gradients sum to the record's one tensor's (optim.tie_sum=step adds them)."""
    model = randomised(config(16))
    with torch.no_grad():
        model.embed.weight.copy_(model.lm_head.weight)  # what the optimizer keeps while tied
    idx, shape, targets = tokens(), SHAPES[16], tokens().roll(-1, 1)
    p, kw = record_params(model), run_args(model)
    p["embed.weight"] = torch.randn_like(p["embed.weight"])  # the record's E, unused until 785
    got = ours(model, idx)
    want = ref.logits(p, idx, shape, tied=True, **kw)
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    assert rel(ref.logits(p, idx, shape, tied=True, misreading="untied", **kw), got) > 1e-4
    loss_got = ours(model, idx, targets)
    loss_want = ref.training_loss(p, idx, targets, MTP, shape, tied=True, **kw)
    g_embed, g_head = torch.autograd.grad(loss_got, [model.embed.weight, model.lm_head.weight])
    (g_record,) = torch.autograd.grad(loss_want, [p["lm_head.weight"]])
    atol = 1e-7 * g_record.abs().max()
    torch.testing.assert_close(g_embed + g_head, g_record, rtol=1e-7, atol=atol)


FP32 = {"scalars.packed", "x0_lambdas.lambdas"}
MATRICES = ("attn.qkvo", "mlp.fc.weight", "mlp.proj.weight")


def test_the_records_shape_has_its_parameter_count_and_dtypes() -> None:
    """The preset at the record's shape (on the meta device): M.1's 613,420,440 values, its
    packed vector padded to 56 entries as on the record's 8 ranks (model.numerics.
    scalars_multiple=8 on any rank count; 613,420,437 used). Its 88 tensors are 77 here: the
    ten 8 × 16 value gates are the slices of one (10, 8, 16) `value_gates.weight` and the
    three 1 × 16 skip gates the rows of one (3, 16) `skips.token_gate.weight`. Tables, head and
    gates bf16; P, C_fc, C_proj, Λ and σ⃗ fp32."""
    preset = dotted(OmegaConf.to_container(OmegaConf.load(PRESET)))
    cfg = update(ModelConfig(), preset | {"compile": False})
    with torch.device("meta"):
        model = GPT(cfg, RECORD_WINDOWS)
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values()) == 613_420_440
    assert len(params) == 77 == 88 - 9 - 2
    tables = ["lm_head.weight", "embed.weight", "embed2.weight",
              *(f"value_embeds.{t}.weight" for t in range(5))]  # fmt: skip
    assert sum(params[n].numel() for n in tables) == 8 * 51_511_296
    matrices = sum(p.numel() for n, p in params.items() if n.endswith(MATRICES))
    assert matrices == 3 * 67_108_864 and params["blocks.0.attn.qkvo"].shape == (4, 1024, 1024)
    small = {"value_gates.weight": (10, 8, 16), "skips.token_gate.weight": (3, 16),
             "smear_gate.weight": (1, 16), "x0_lambdas.lambdas": (16, 2),
             "scalars.packed": (56,)}  # fmt: skip
    assert {n: tuple(params[n].shape) for n in small} == small
    assert sum(params[n].numel() for n in small) + 16 * 8 * 16 == 3_480
    for name, p in params.items():
        fp32 = name in FP32 or name.endswith(MATRICES)
        assert p.dtype == (torch.float32 if fp32 else torch.bfloat16), name


def test_the_preset_takes_a_training_step_with_its_roundings() -> None:
    """The preset as it runs (bf16 weights, stream and rotary, the bf16 training cap and MTP)
    at toy width: a finite loss that reaches every parameter; evaluation is next-token mean
    cross-entropy near ln(50,304) from the N(0, 0.005²) head; the value tables start at zero
    and the head is the table's copy."""
    torch.manual_seed(0)
    preset = dotted(OmegaConf.to_container(OmegaConf.load(PRESET)))
    toy = {"n_head": H, "n_embd": H * D, "compile": False}
    model = GPT(update(ModelConfig(), preset | toy), RECORD_WINDOWS)
    assert torch.equal(model.embed.weight, model.lm_head.weight)
    assert not any(t.weight.any() for t in model.value_embeds.values())
    idx = tokens()
    windows = {"window_tokens": torch.tensor(48.0), "short_window_tokens": torch.tensor(16.0),
               "yarn_stage": torch.tensor(1)}  # fmt: skip
    mtp = torch.tensor([1.0, 0.5, 0.25], dtype=torch.float64)
    loss = model(idx, idx.roll(-1, 1), **windows, mtp_weights=mtp)
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    model.eval()
    with torch.no_grad():
        val = model(idx, idx.roll(-1, 1), **windows)
    assert 10 < val.item() < 12  # ≈ ln(50304) = 10.83


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"residual.skips": [[9, 6]]}, r"model\.residual\.skips\[0\] must be a pair \[from, to\]"),
        ({"residual.skips": [[6, 16]]}, r"must be a pair .* below model\.n_layer \(16\)"),
        ({"residual.skips": [[1, 2, 3]]}, r"model\.residual\.skips\[0\] must be a pair"),
        ({"numerics.scalars_layout": "weight_lambdas", "residual.x0_lambdas": False,
          "residual.x0_shortcut": False, "embed.second_table": False},
         r"scalars_layout=weight_lambdas holds one skip logit, model\.residual\.skips has 3"),
        ({"numerics.scalars_layout": "mixes", "attention.weight_lambdas": False,
          "residual.x0_lambdas": False, "embed.second_table": False},
         r"scalars_layout=mixes holds one skip logit"),
        ({"residual.x0_lambdas": False, "embed.second_table": False},
         r"residual_weight_lambdas holds the x0 shortcut's a_ℓ .* set model\.residual\.x0_lambdas"),
        ({"embed.second_table": True, "residual.x0_lambdas": False,
          "residual.x0_shortcut": False}, r"second_table adds x02 .*x0_lambdas=true$"),
        ({"residual.x0_shortcut": False}, r"x0_lambdas holds the x0 shortcut's weights"),
        ({"embed.value_gate": False}, r"no place for the ungated value tables"),
        ({"attention.rope": "full"}, r"key_offset shifts the key channels the rotary leaves"),
        ({"embed.value_gate_input": "value"}, r"model\.embed\.value_gate_input must be one of"),
        ({"attention.yarn_max_window": -1}, r"model\.attention\.yarn_max_window must be >= 0"),
        ({"head.loss": "fused"}, r"loss=fused computes c·tanh\(z/c\)"),
    ],
)  # fmt: skip
def test_bad_settings_name_their_key(changes: dict, says: str) -> None:
    """Each of record_medium_2025_12_31's keys, set where it cannot work, fails naming what to
    change."""
    with pytest.raises(ValueError, match=says):
        update(config(16), changes).validate()
