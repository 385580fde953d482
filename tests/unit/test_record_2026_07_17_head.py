"""record_2026_07_17's head and loss, the parts built so far (docs/records.md D.2, with
its FP8 head): the softcap 23·σ((z + 5)/7.5) and its cross-entropy, against the formula."""

import pytest
import torch
import torch.nn.functional as F

from model.config import HeadConfig
from model.loss import model_loss, softcap

RECORD_2026_07_17 = HeadConfig(softcap=23.0, softcap_form="sigmoid", softcap_shift=5.0,
                      softcap_divisor=7.5, loss="auto")  # fmt: skip


def logits(dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(2, 6, 50, generator=gen) * 12).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_the_cap_is_the_records_formula_in_its_order(dtype: torch.dtype) -> None:
    """(z + 5) first, then / 7.5, σ, × 23, each in the logits' dtype, as the record writes it."""
    z = logits(dtype)
    want = 23 * torch.sigmoid((z + 5) / 7.5)
    assert torch.equal(softcap(z, 23.0, "sigmoid", 5.0, 7.5), want)
    assert not torch.equal(want, 23 * torch.sigmoid(z / 7.5))  # the shift is not a no-op
    assert not torch.equal(want, 23 * torch.sigmoid((z + 5) / (23 / 4)))  # τ is not c/4


def test_the_loss_and_its_gradient_are_the_formulas() -> None:
    """auto on a CPU takes the plain formula for this cap (the fused loss computes only
    c·tanh(z/c)); the mean cross-entropy and ∂L/∂z = (softmax(s) − onehot)·23·σ'(u)/7.5 / N
    with s the capped logits and u = (z + 5)/7.5, in float64."""
    z = logits(torch.float64).requires_grad_()
    y = torch.randint(0, 50, (2, 6), generator=torch.Generator().manual_seed(1))
    loss = model_loss(z, y, RECORD_2026_07_17, True)
    u = (z.detach() + 5) / 7.5
    s = 23 * torch.sigmoid(u)
    want = torch.logsumexp(s, -1) - s.gather(-1, y[..., None]).squeeze(-1)
    torch.testing.assert_close(loss, want.mean(), rtol=1e-14, atol=0)
    loss.backward()
    dsdz = 23 * torch.sigmoid(u) * (1 - torch.sigmoid(u)) / 7.5
    grad = (torch.softmax(s, -1) - F.one_hot(y, 50).double()) * dsdz / y.numel()
    torch.testing.assert_close(z.grad, grad, rtol=1e-12, atol=1e-18)


def test_evaluation_returns_the_capped_logits() -> None:
    z = logits()
    torch.testing.assert_close(
        model_loss(z, None, RECORD_2026_07_17, False), 23 * torch.sigmoid((z + 5) / 7.5)
    )


def test_the_shifted_sigmoid_refuses_what_cannot_compute_it() -> None:
    with pytest.raises(ValueError, match=r"model\.head\.loss=fused"):
        HeadConfig(**{**RECORD_2026_07_17.__dict__, "loss": "fused"}).validate()
    with pytest.raises(ValueError, match=r"softcap_form=sigmoid"):
        HeadConfig(softcap_shift=5.0).validate()  # the tanh form has no shift
    with pytest.raises(ValueError, match=r"model\.head\.softcap_divisor must be >= 0"):
        HeadConfig(softcap_form="sigmoid", softcap_divisor=-1.0).validate()
    RECORD_2026_07_17.validate()
    # The 2025-01 form written with its own τ = c/4 is still the fused tanh's
    assert HeadConfig(softcap_form="sigmoid", softcap_divisor=7.5).tanh_expressible
    assert not RECORD_2026_07_17.tanh_expressible


def test_the_record_loss_compiles_with_inductor_in_row_chunks() -> None:
    """The FP8 head and the record's loss in three row chunks, compiled as the model is
    (`compile_model`, inductor), give eager's gradients bit for bit and its loss to fp32's
    summation order. The chunks' e5m2 gradients are joined by a concatenation, which inductor
    lowers in FP8 (a write into an empty e5m2 buffer is not: a type-promotion error here, a NaN
    e5m2 constant that Triton cannot build on a GPU); and the compile keeps the casts the loss
    writes (σ to bf16): without that, most gradient entries differ."""
    from model.record_loss import record_head_loss
    from trainer.launch.compile import compile_model

    cfg = HeadConfig(**{**RECORD_2026_07_17.__dict__, "loss": "sigmoid_e5m2_grad", "mtp": True})
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(32, 64, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        head.weight.copy_(torch.randn(64, 32, generator=gen) * 0.08)
    x = torch.randn(2, 6, 32, generator=gen).to(torch.bfloat16)
    y = torch.randint(0, 64, (2, 6), generator=gen)
    w = torch.tensor([1.0, 0.5])

    class Loss(torch.nn.Module):
        def forward(self, xs: torch.Tensor) -> torch.Tensor:
            return record_head_loss(head, xs, y, w, cfg, "fixed_over_448", 1, 4)

    def step(fn: torch.nn.Module) -> tuple[torch.Tensor, ...]:
        xs = x.clone().requires_grad_()
        head.weight.grad = None
        loss = fn(xs)
        loss.backward()
        return loss, xs.grad, head.weight.grad

    torch._dynamo.reset()
    (loss, *grads), (want, *want_grads) = step(compile_model(Loss())), step(Loss())
    torch.testing.assert_close(loss, want, rtol=1e-6, atol=0)
    assert all(torch.equal(g, h) for g, h in zip(grads, want_grads, strict=True))
