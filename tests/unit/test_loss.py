"""The fused softcapped cross-entropy equals the plain formula, in value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from model import loss as loss_module
from model.loss import softcap_cross_entropy

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16


@pytest.mark.parametrize("n", [1, 37, 300])  # fewer rows than a chunk, a ragged last chunk
@pytest.mark.parametrize("chunk", [16, 128, "all"])  # "all": one chunk, as on a GPU
def test_matches_plain_softcap_cross_entropy(n: int, chunk: int | str) -> None:
    chunk_rows = n if chunk == "all" else chunk
    gen = torch.Generator().manual_seed(n)
    logits = (torch.randn(n, 1000, generator=gen) * 40).requires_grad_()  # well into the cap
    targets = torch.randint(0, 1000, (n,), generator=gen)

    ref = F.cross_entropy(30.0 * torch.tanh(logits / 30.0), targets)
    (ref_grad,) = torch.autograd.grad(ref * 3.0, logits)  # a non-unit upstream gradient
    out = softcap_cross_entropy(logits, targets, 30.0, chunk_rows)
    (grad,) = torch.autograd.grad(out * 3.0, logits)

    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-8)


def test_bf16_logits_give_fp32_loss_and_bf16_grad() -> None:
    logits = torch.randn(8, 100).bfloat16().requires_grad_()
    targets = torch.randint(0, 100, (8,))
    out = softcap_cross_entropy(logits, targets, 15.0)
    out.backward()
    assert out.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16
    ref = F.cross_entropy(15.0 * torch.tanh(logits.float() / 15.0), targets)
    torch.testing.assert_close(out, ref)


def test_chunking_follows_the_device() -> None:
    """Cache-sized chunks on a CPU; one chunk of every row on other devices (a GPU)."""
    assert loss_module.default_chunk_rows(1000, torch.device("cpu")) == loss_module.CPU_CHUNK_ROWS
    assert loss_module.default_chunk_rows(1000, torch.device("cuda")) == 1000
    assert loss_module.default_chunk_rows(0, torch.device("cuda")) == 1


def test_bf16_train_caps_in_bf16_for_training_and_in_fp32_for_evaluation() -> None:
    """model.head.loss_dtype=bf16_train (record_medium_2025_12_31, M.2): in training the cap is
    rounded to bf16 once and the cross-entropy (or the MTP loss) taken of those values in fp32; in
    evaluation the logits are cast to fp32 before the cap. record_2026_07_17's `bf16` keeps the
    training cross-entropy in bf16 and the evaluation cap in bf16: both differ on these logits."""
    from model.config import HeadConfig
    from model.loss import model_loss, softcap

    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 8, 64, generator=gen) * 6).bfloat16()
    y = torch.randint(0, 64, (2, 8), generator=gen)
    cfg = HeadConfig(softcap=23.0, softcap_form="sigmoid", softcap_shift=5.0,
                     softcap_divisor=7.5, loss="plain", reduction="sum",
                     loss_dtype="bf16_train")  # fmt: skip
    capped = softcap(logits, 23.0, "sigmoid", 5.0, 7.5)  # bf16
    assert capped.dtype == torch.bfloat16
    want = F.cross_entropy(capped.float().flatten(0, 1), y.flatten(), reduction="sum")
    got = model_loss(logits, y, cfg, training=True)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    mtp = model_loss(logits, y, HeadConfig(**{**cfg.__dict__, "mtp": True}), True,
                     torch.tensor([1.0, 0.0]))  # fmt: skip
    assert torch.equal(mtp, want)  # a zero second weight: the next-token sum
    fp32_cap = softcap(logits.float(), 23.0, "sigmoid", 5.0, 7.5)
    val = F.cross_entropy(fp32_cap.flatten(0, 1), y.flatten())
    assert torch.equal(model_loss(logits, y, cfg, training=False), val)
    bf16 = HeadConfig(**{**cfg.__dict__, "loss_dtype": "bf16"})
    assert not torch.equal(model_loss(logits, y, bf16, training=True), want)
    assert not torch.equal(model_loss(logits, y, bf16, training=False), val)
