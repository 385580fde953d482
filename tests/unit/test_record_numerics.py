"""The record presets' evaluation orders, bit for bit against the records' own expressions.

Each test writes the record's expression out literally, in the record's order of operations
(docs/records.md, and the logged scripts it describes), without calling the code under test, and
requires the repo's form to give the same bits: rotary frequencies and tables, the
Newton–Schulz polynomial of each record, the sigmoid softcap and the LR cooldown. Where the
default form rounds differently, the test also shows that it does, so that a form which
silently fell back to the default could not pass.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from model.loss import softcap
from model.rotary import Rotary
from optim.config import OptimConfig, ScheduleConfig
from optim.muon.newton_schulz import (
    RECORD_FORMS,
    ns_coefficients,
    orthogonalise,
    quintic_step,
    zeropower,
)
from optim.schedule import lr_multiplier, optim_values
from trainer.config import Config

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

A_COEFFS = (3.4445, -4.7750, 2.0315)  # both records' quintic
EXPERIMENTS = Path(__file__).resolve().parents[2] / "conf" / "experiment"


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# --- rotary -------------------------------------------------------------------------------


def _tables(rotary: Rotary, T: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The cos and sin tables a Rotary applies, read off its output: rotating z = (1, 0)
    gives (1·cos + 0·sin, 0·cos − 1·sin) = (cos, −sin), exactly in any precision."""
    x = torch.cat([torch.ones(1, T, 1, D // 2), torch.zeros(1, T, 1, D // 2)], -1).bfloat16()
    y = rotary(x)
    return y[0, :, 0, : D // 2], -y[0, :, 0, D // 2 :]


def test_reciprocal_rope_frequencies_and_bf16_tables_are_record_2024_11_06():
    d, T = 128, 1024
    record = 1 / 10000 ** (torch.arange(0, d, 2).float() / d)
    ours = Rotary(d, 10000.0, "full", bf16=True, reciprocal=True)
    assert ours.inv_freq.dtype == torch.float32 and torch.equal(ours.inv_freq, record)
    # The default keeps base^(−2i/d): one fp32 ulp off on some frequencies (20 of 64 here).
    default = Rotary(d, 10000.0, "full", bf16=True)
    assert torch.equal(default.inv_freq, 10000.0 ** (-(torch.arange(0, d, 2).float() / d)))
    differ = default.inv_freq != record
    assert differ.any()
    assert torch.equal(torch.nextafter(default.inv_freq, record)[differ], record[differ])
    # record_2024_11_06's tables: fp32 angles t·θ, cos and sin rounded to bf16.
    t = torch.arange(T).type_as(record)
    freqs = torch.outer(t, record)
    cos, sin = freqs.cos().bfloat16(), freqs.sin().bfloat16()
    got_cos, got_sin = _tables(ours, T, d)
    assert torch.equal(got_cos, cos) and torch.equal(got_sin, sin)
    default_cos, default_sin = _tables(default, T, d)
    assert not (torch.equal(default_cos, cos) and torch.equal(default_sin, sin))


def test_record_2024_11_06_rotation_in_bf16():
    """record_2024_11_06 rotates bf16 q/k with the bf16 tables: y1 = x1·cos + x2·sin,
    y2 = x1·(−sin) + x2·cos, every product and sum rounded to bf16."""
    d, T = 128, 256
    inv_freq = 1 / 10000 ** (torch.arange(0, d, 2).float() / d)
    freqs = torch.outer(torch.arange(T).type_as(inv_freq), inv_freq)
    cos, sin = freqs.cos().bfloat16()[None, :, None], freqs.sin().bfloat16()[None, :, None]
    x = _randn(2, T, 3, d, seed=0).bfloat16()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    record = torch.cat([x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos], 3).type_as(x)
    ours = Rotary(d, 10000.0, "full", bf16=True, reciprocal=True)(x)
    assert torch.equal(ours, record)


def test_half_truncated_rope_is_record_2025_01_26_as_it_is():
    """record_2025_01_26's frequencies (1/1024)^linspace(0, 1, d/4), then d/4 zeros, its fp32 tables
    from an einsum of positions and frequencies, and its fp32 rotation of bf16 q/k: the
    "half_truncated" mode already computes all of it the same way (no option needed)."""
    d, T = 128, 1024
    freq = (1 / 1024) ** torch.linspace(0, 1, steps=d // 4, dtype=torch.float32)
    freq = torch.cat([freq, freq.new_zeros(d // 4)])
    ours = Rotary(d, mode="half_truncated")
    assert torch.equal(ours.inv_freq, freq)
    theta = torch.einsum("i,j -> ij", torch.arange(T, dtype=torch.float32), freq)
    cos, sin = theta.cos()[None, :, None, :], theta.sin()[None, :, None, :]
    x = _randn(1, T, 2, d, seed=1).bfloat16()
    x1, x2 = x.to(dtype=torch.float32).chunk(2, dim=-1)
    record = torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), 3).type_as(x)
    assert torch.equal(ours(x), record)


# --- Newton–Schulz ------------------------------------------------------------------------


def record_2024_11_06_zeropower(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """record_2024_11_06's Newton–Schulz of one 2-D matrix, in its order: normalise, then transpose
    a tall matrix (a view), then P = A·X, X = a·X + b·P + c·A @ P (Python: (c·A)·P)."""
    a, b, c = A_COEFFS
    X = G.bfloat16()
    X /= X.norm() + eps
    if G.size(0) > G.size(1):
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = A @ X
        X = a * X + b * B + c * A @ B
    if G.size(0) > G.size(1):
        X = X.T
    return X


def record_2025_01_26_zeropower(G: torch.Tensor, steps: int = 5, eps: float = 1e-7) -> torch.Tensor:
    """record_2025_01_26's, batched over leading dimensions: transpose a tall stack (a view), each
    matrix divided by its own norm, then B = b·A + c·A @ A (Python: (c·A)·A), X = a·X + B·X."""
    a, b, c = A_COEFFS
    X = G.bfloat16()
    if G.size(-2) > G.size(-1):
        X = X.mT
    X = X / (X.norm(dim=(-2, -1), keepdim=True) + eps)
    for _ in range(steps):
        A = X @ X.mT
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(-2) > G.size(-1):
        X = X.mT
    return X


CLASSIC5 = ns_coefficients("classic", 5)


def test_one_iteration_of_each_record_form():
    a, b, c = A_COEFFS
    for shape, seed in (((256, 256), 2), ((64, 256), 3)):
        X = _randn(*shape, seed=seed).bfloat16()
        X = X / (X.norm() + 1e-7)
        A = X @ X.T
        B = A @ X
        record_2024_11_06 = a * X + b * B + c * A @ B
        assert torch.equal(quintic_step(X, A, a, b, c, "expanded"), record_2024_11_06)
        # a 3-stack, like the merged QKV weight
        Xs = _randn(3, *shape, seed=seed + 10).bfloat16()
        Xs = Xs / (Xs.norm(dim=(-2, -1), keepdim=True) + 1e-7)
        As = Xs @ Xs.mT
        Bs = b * As + c * As @ As
        record_2025_01_26 = a * Xs + Bs @ Xs
        assert torch.equal(quintic_step(Xs, As, a, b, c, "factored_unfused"), record_2025_01_26)
        factored = quintic_step(Xs, As, a, b, c, "factored")
        assert not torch.equal(factored, record_2025_01_26)


def test_expanded_zeropower_is_record_2024_11_06():
    """5 steps in bf16, incl. the normalisation and the transpose rule; 1536×384 is tall like
    record_2024_11_06's W_fc, large enough that its column-major view rounds unlike a contiguous
    copy on a CPU."""
    for shape, seed in (((256, 256), 4), ((64, 256), 5), ((256, 64), 6), ((1536, 384), 7)):
        G = _randn(*shape, seed=seed)
        record = record_2024_11_06_zeropower(G)
        assert torch.equal(zeropower(G, CLASSIC5, 1e-7, form="expanded"), record), shape
        assert not torch.equal(zeropower(G, CLASSIC5, 1e-7, form="factored"), record), shape


def test_factored_unfused_zeropower_is_record_2025_01_26():
    """Batched over a 3-stack (each slice by its own norm), and a tall W_fc-like matrix."""
    for shape, seed in (((3, 256, 256), 8), ((3, 64, 256), 9), ((1536, 384), 10)):
        G = _randn(*shape, seed=seed)
        record = record_2025_01_26_zeropower(G)
        assert torch.equal(zeropower(G, CLASSIC5, 1e-7, form="factored_unfused"), record), shape
        assert not torch.equal(zeropower(G, CLASSIC5, 1e-7, form="factored"), record), shape


# ~25 s where bf16 is emulated (its tall matrices): slow, so the emulated pass leaves it to the
# main one (its bf16 is asked for, whatever the CPU: no CPU-dependent path; Makefile)
@pytest.mark.slow
def test_orthogonalise_batches_record_forms_as_the_records_run_them():
    """Muon's batched path: matrices of one shape share a stack, tall ones batched tall (so each is
    iterated in the record's layout), a lone matrix passed as itself, a 3-stack per slice. Every
    result is the record's, matrix by matrix (record_2024_11_06) or per parameter
    (record_2025_01_26)."""
    # Tall shapes large enough that, on a CPU, a contiguous copy and a stack of one round unlike
    # the record's column-major 2-D view.
    updates = {
        0: _randn(1536, 384, seed=12),  # two tall matrices (W_fc-like), batched tall
        1: _randn(1536, 384, seed=13),
        2: _randn(384, 1536, seed=14),  # a lone wide one (W_proj-like)
        3: _randn(3, 256, 256, seed=15),  # a merged QKV, batched with a square W_o
        4: _randn(256, 256, seed=16),
        5: _randn(1536, 256, seed=17),  # a lone tall one, passed as itself
    }
    for form, record in (("expanded", None), ("factored_unfused", record_2025_01_26_zeropower)):
        assert form in RECORD_FORMS
        out = orthogonalise(list(updates.values()), "classic", 5, 1e-7, torch.bfloat16, form)
        for i, u in updates.items():
            if record is None:  # record_2024_11_06: one 2-D matrix at a time
                want = torch.stack(
                    [record_2024_11_06_zeropower(m) for m in u.reshape(-1, *u.shape[-2:])]
                )
                want = want.reshape(u.shape)
            else:
                want = record(u)
            assert out[i].shape == u.shape and torch.equal(out[i], want), (form, i)


# --- softcap ------------------------------------------------------------------------------


def test_sigmoid_softcap_divides_by_7_5_as_record_2025_01_26():
    z = _randn(512, 1024, seed=18) * 20
    record = 30 * torch.sigmoid(z / 7.5)
    assert torch.equal(softcap(z, 30.0, "sigmoid"), record)
    # The model casts bf16 logits to fp32 before the cap.
    zb = z.bfloat16()
    assert torch.equal(softcap(zb.float(), 30.0, "sigmoid"), 30 * torch.sigmoid(zb.float() / 7.5))
    # Multiplying by 4/30 (not exact in binary) rounds differently on some logits.
    assert not torch.equal(30.0 * torch.sigmoid(z * (4.0 / 30.0)), record)


# --- LR schedule --------------------------------------------------------------------------


def record_2025_01_26_lr(step: int, steps: int, frac: float, floor: float) -> float:
    t = 1 - step / steps
    w = min(t / frac, 1.0)
    return w * 1.0 + (1 - w) * floor


def test_fraction_cooldown_is_record_2025_01_26_at_every_step():
    for steps in (1770, 100, 37):
        got = [lr_multiplier(s, steps, 0, 0.4, 0.1, cooldown_form="fraction") for s in range(steps)]
        assert got == [record_2025_01_26_lr(s, steps, 0.4, 0.1) for s in range(steps)], steps
    # Where 0.4 · S is not whole, the steps form starts its line at a rounded step: it differs
    # by far more than rounding (at S = 1770 and 100 by rounding only).
    steps_form = [lr_multiplier(s, 37, 0, 0.4, 0.1) for s in range(37)]
    diff = max(abs(x - record_2025_01_26_lr(s, 37, 0.4, 0.1)) for s, x in enumerate(steps_form))
    assert diff > 1e-3
    assert any(
        lr_multiplier(s, 100, 0, 0.4, 0.1) != record_2025_01_26_lr(s, 100, 0.4, 0.1)
        for s in range(100)
    )
    # Warmup comes first, as in the steps form; after it, the record's expression.
    assert lr_multiplier(4, 100, 10, 0.4, 0.1, "fraction") == 0.5
    assert lr_multiplier(80, 100, 10, 0.4, 0.1, "fraction") == record_2025_01_26_lr(
        80, 100, 0.4, 0.1
    )


def test_cooldown_form_is_checked():
    with pytest.raises(ValueError, match="cooldown_form must be one of"):
        lr_multiplier(0, 10, 0, 0.4, 0.1, cooldown_form="cosine")
    with pytest.raises(ValueError, match=r"optim\.schedule\.cooldown_form must be one of"):
        Config(optim=OptimConfig(schedule=ScheduleConfig(cooldown_form="cosine"))).validate()
    assert ScheduleConfig().cooldown_form == "steps"  # the default run keeps its schedule
    # No cooldown at all: 1 throughout, as in the steps form.
    assert {lr_multiplier(s, 10, 0, 0.0, 0.1, "fraction") for s in range(10)} == {1.0}
    fraction = OptimConfig(schedule=ScheduleConfig(0, 0.4, 0.1, cooldown_form="fraction"))
    assert optim_values(fraction, 1769, 1770).lr_mult == record_2025_01_26_lr(1769, 1770, 0.4, 0.1)


def test_steps_cooldown_is_record_2024_11_06_at_every_step():
    """record_2024_11_06: 1 until step 2286, then (3200 − s)/914 with an integer 914."""
    got = [lr_multiplier(s, 3200, 0, 0.2856, 0.0) for s in range(3200)]
    assert got == [1.0 if s < 2286 else (3200 - s) / 914 for s in range(3200)]


def test_presets_select_the_record_forms():
    a = yaml.safe_load((EXPERIMENTS / "record_2024_11_06.yaml").read_text())
    b = yaml.safe_load((EXPERIMENTS / "record_2025_01_26.yaml").read_text())
    a_att, b_att = a["model"]["attention"], b["model"]["attention"]
    assert a_att["rope_reciprocal"] is True and a_att.get("rope", "full") == "full"
    assert a["optim"]["muon"]["ns_form"] == "expanded"
    assert a["optim"]["schedule"].get("cooldown_form", "steps") == "steps"
    assert b_att["rope"] == "half_truncated" and b["model"]["head"]["softcap_form"] == "sigmoid"
    assert b["optim"]["muon"]["ns_form"] == "factored_unfused"
    assert b["optim"]["schedule"]["cooldown_form"] == "fraction"


def test_the_yarn_scale_multiplies_q_unrounded() -> None:
    """On SDPA's path the stage's attention scale multiplies the bf16 q as an fp32 number:
    one rounding of q·s, as the record's kernel scales in fp32. Rounding s to bf16 first
    (0.1 -> 0.10009765625) gives other bits."""
    from model.attend import attend

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=gen).bfloat16() for _ in range(3))
    scale = torch.tensor(0.1, dtype=torch.float64)  # the model's table of stage scales
    once = F.scaled_dot_product_attention((q.float() * 0.1).bfloat16(), k, v, is_causal=True,
                                          scale=1.0)  # fmt: skip
    assert torch.equal(attend(q, k, v, None, scale), once)
    twice = F.scaled_dot_product_attention(q * scale.bfloat16(), k, v, is_causal=True, scale=1.0)
    assert not torch.equal(once, twice)


def test_the_yarn_scale_reaches_flex_as_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """On FlexAttention's path the stage's float64 scale enters the score_mod as fp32, as a
    float scale enters the kernel: fp32 scores stay fp32 (a float64 factor would promote the
    kernel's softmax state and accumulator, which Triton's template refuses on a GPU)."""
    import model.attend as attention

    seen: list[torch.dtype] = []

    def flex(q, k, v, block_mask, scale, score_mod):
        score = torch.randn((), dtype=torch.float32)  # 0-d, as flex traces its score_mod
        seen.append(score_mod(score, *(torch.zeros((), dtype=torch.int32),) * 4).dtype)
        return v

    monkeypatch.setattr(attention, "_flex", lambda q: flex)
    q = torch.randn(1, 2, 16, 8).bfloat16()
    mask = object()  # any block mask: the branch is taken for a non-tensor mask
    attention.attend(q, q, q, mask, torch.tensor(0.1, dtype=torch.float64))  # type: ignore[arg-type]
    assert seen == [torch.float32]
