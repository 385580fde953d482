"""The FP8 head's gradient cast sees the same values whatever the gradient accumulation.

Record B runs 8 GPUs with one micro-step each: every rank's e5m2 cast scales the gradient of
its own mean loss by 2¹⁹. One process with 8 micro-steps backpropagates loss / 8, so without
a correction the cast would see values 8 times smaller (an effective 2¹⁶) and flush more small
gradients to zero. With `micro_steps` the head undoes the factor inside the cast, and 8
accumulated micro-steps give the head gradient that 8 ranks averaging their own would: equal
up to the order of the sum.
"""

from dataclasses import replace

import pytest
import torch

from model import GPT, ModelConfig
from trainer.forward import forward_backward
from trainer.runtime import init_runtime

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

CFG = ModelConfig(n_layer=1, n_head=2, n_embd=64, dtype="bf16", fp8_head=True, loss="plain",
                  softcap_form="sigmoid")  # fmt: skip
ROWS, T = 8, 64


def head_grad_accumulated(model: GPT, x: torch.Tensor, y: torch.Tensor, micro_steps: int):
    """One process, ROWS micro-steps of one row each, as the loop runs them."""
    model.zero_grad(set_to_none=True)
    model.micro_steps = micro_steps
    forward_backward(model, (x, y), init_runtime("cpu", "none"), accum_steps=ROWS)
    return model.lm_head.weight.grad.clone()


def head_grad_of_ranks(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """ROWS "ranks" of one row each, no accumulation, gradients averaged as DDP does."""
    grads = []
    model.micro_steps = 1
    for r in range(ROWS):
        model.zero_grad(set_to_none=True)
        model(x[r : r + 1], y[r : r + 1]).backward()
        grads.append(model.lm_head.weight.grad.clone())
    return torch.stack(grads).mean(0)


def test_accumulated_fp8_head_gradient_equals_the_ranks_average() -> None:
    torch.manual_seed(0)
    model = GPT(CFG)
    with torch.no_grad():  # spread logits: many probabilities small enough to meet e5m2's floor
        model.lm_head.weight.normal_(0.0, 0.5).clamp_(-0.85, 0.85)  # in e4m3 range once × 512
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 50257, (ROWS * T + 1,), generator=g)
    x, y = tokens[:-1].view(ROWS, T), tokens[1:].view(ROWS, T)
    ranks = head_grad_of_ranks(model, x, y)
    fixed = head_grad_accumulated(model, x, y, micro_steps=ROWS)
    unfixed = head_grad_accumulated(model, x, y, micro_steps=1)

    def rel(a: torch.Tensor) -> float:
        return ((a - ranks).norm() / ranks.norm()).item()

    torch.testing.assert_close(fixed, ranks, rtol=1e-5, atol=1e-9)
    assert rel(unfixed) > 100 * max(rel(fixed), 1e-9), (rel(unfixed), rel(fixed))


def test_micro_steps_change_nothing_outside_the_fp8_head() -> None:
    """bf16 head: the factor is not used, the gradients are the same bits."""
    torch.manual_seed(0)
    model = GPT(replace(CFG, fp8_head=False))
    x = torch.randint(0, 50257, (ROWS, T))
    a = head_grad_accumulated(model, x, x.roll(-1, 1), micro_steps=ROWS)
    b = head_grad_accumulated(model, x, x.roll(-1, 1), micro_steps=1)
    assert torch.equal(a, b)
