"""model.head.loss_kernel=triton where the model calls it (`record_head_loss`, the FP8 head
and the loss in one autograd function): the loss and the head's gradients through the Triton
kernel (Triton's interpreter on a CPU) equal the torch loss's, and the key is refused where
the kernel cannot run or has nothing to compute. The kernel itself against its reference:
tests/unit/test_triton_loss.py."""

import dataclasses

import pytest
import torch
from torch import nn

from model.record_loss import record_head_loss
from tests.helpers import RECORD_89_TOY, compose_config
from trainer.config import to_config

pytest.importorskip("triton", reason="the Triton loss kernel needs triton (pip install triton)")
# Record #89's head: sigmoid cap 23 / 5 / 7.5, the e5m2 gradient, MTP (the preset's own config)
HEAD = to_config(compose_config(RECORD_89_TOY)).model.head


def head_grads(kernel: str, micro_steps: int) -> tuple[torch.Tensor, ...]:
    """(loss, ∂x, ∂W) of 2 rows of 40 positions, d 48, a vocabulary of 1,000 (the interpreter
    runs a program a row in numpy), MTP weights [1, 0.5, 0.25], pow2 scales."""
    g = torch.Generator().manual_seed(micro_steps)
    head = nn.Linear(48, 1000, bias=False).bfloat16()
    with torch.no_grad():
        head.weight.copy_(torch.randn(1000, 48, generator=g) * 0.05)
    x = torch.randn(2, 40, 48, generator=g)
    x = (x / x.pow(2).mean(-1, keepdim=True).sqrt()).bfloat16().requires_grad_()
    targets = torch.randint(0, 1000, (2, 40), generator=g)
    cfg = dataclasses.replace(HEAD, loss_kernel=kernel)
    weights = torch.tensor([1.0, 0.5, 0.25])
    loss = record_head_loss(head, x, targets, weights, cfg, "pow2", micro_steps)
    loss.backward()
    return loss.detach(), x.grad, head.weight.grad


@pytest.mark.parametrize("micro_steps", [1, 4])
def test_the_head_trains_through_the_kernel_as_through_torch(
    monkeypatch: pytest.MonkeyPatch, micro_steps: int
) -> None:
    """The loss to 1e-6; ∂x and ∂W equal (G₈, all the kernel hands the backward, came out
    byte for byte), also under accumulation (the divisor g_s·grad_scale)."""
    import model.triton_loss as triton_loss

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls, kernel = [], triton_loss.record_loss_rows_triton
    monkeypatch.setattr(
        triton_loss, "record_loss_rows_triton", lambda *a: calls.append(1) or kernel(*a)
    )
    want = head_grads("torch", micro_steps)
    assert not calls
    got = head_grads("triton", micro_steps)
    assert calls == [1], "the key reached the kernel: one launch for every row"
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    assert torch.equal(got[1], want[1]) and torch.equal(got[2], want[2])


def test_a_compiled_head_calls_the_kernel_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (fullgraph: a graph break fails) over the head and loss calls the kernel
    as an opaque op, the loss and gradients equal to eager's through it."""
    from model.triton_loss import ops

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    ops()  # as the model does when built
    cfg = dataclasses.replace(HEAD, loss_kernel="triton")
    g = torch.Generator().manual_seed(9)
    w = (torch.randn(1000, 48, generator=g) * 0.05).bfloat16()
    x = torch.randn(1, 12, 48, generator=g)
    x = (x / x.pow(2).mean(-1, keepdim=True).sqrt()).bfloat16()
    targets = torch.randint(0, 1000, (1, 12), generator=g)
    weights = torch.tensor([1.0, 0.5, 0.25])
    results = []
    for backend in (None, "aot_eager"):
        head = nn.Linear(48, 1000, bias=False).bfloat16()
        with torch.no_grad():
            head.weight.copy_(w)
        inp = x.clone().requires_grad_()

        def loss_of(inp, head=head):
            return record_head_loss(head, inp, targets, weights, cfg, "pow2", 1)

        fn = loss_of if backend is None else torch.compile(loss_of, backend=backend, fullgraph=True)
        loss = fn(inp)
        loss.backward()
        results.append((loss.detach(), inp.grad, head.weight.grad))
    for name, a, b in zip(("loss", "∂x", "∂W"), *results, strict=True):
        assert torch.equal(a, b), name


def test_where_the_kernel_cannot_run_or_has_nothing_to_do_the_key_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from model.gpt import GPT

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    conf = to_config(compose_config([*RECORD_89_TOY, "model.head.loss_kernel=triton"]))
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    with pytest.raises(ValueError, match=r"loss_kernel=triton: cpu tensors need .*interpreter"):
        model.check_device(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"loss_kernel=triton is the kernel of .*this run's"):
        to_config(compose_config(["model.head.loss_kernel=triton", "run_dir=."]))
