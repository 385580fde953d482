"""model/points.py and model/part.py: a part acts at its named point of the forward, in the
order the point lists it, and declares its own init, bf16 cast and FSDP unit.

A part here is a stand-in written for the test, added to `GPT.points` with no edit of the
model: it must be called once per attention layer, in layer order, with the forward's own
context, and two parts at one point must act in their listed order.
"""

import dataclasses

import pytest
import torch
from torch import Tensor

from model import GPT, ModelConfig
from model.config import update
from model.context import Context
from model.part import Part

CFG = ModelConfig(n_layer=3, n_head=2, n_embd=32)


class Recorder(Part):
    """After each attention sublayer: records (layer, x after the add) and applies `f`."""

    def __init__(self, f=lambda x: x) -> None:
        super().__init__()
        self.f, self.calls = f, []

    def reset(self) -> None:
        pass

    def after_attention(self, x: Tensor, ctx: Context, layer: int) -> Tensor:
        self.calls.append((layer, x.detach().clone(), ctx.x0))
        return self.f(x)


def model_with(*parts: Part) -> GPT:
    torch.manual_seed(0)
    model = GPT(CFG)
    with torch.no_grad():  # non-zero outputs, so each layer's stream differs
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model.points = dataclasses.replace(model.points, after_attention=parts)
    return model


def test_a_part_at_after_attention_is_called_per_layer_in_order() -> None:
    idx = torch.randint(0, 50257, (2, 16), generator=torch.Generator().manual_seed(1))
    plain = model_with()
    assert plain.points.after_attention == ()  # the default model: no part, nothing called
    watch = Recorder()
    watched = model_with(watch)
    torch.testing.assert_close(watched(idx), plain(idx), rtol=0, atol=0)  # identity part
    assert [layer for layer, _, _ in watch.calls] == [0, 1, 2]
    assert all(x0 is None for _, _, x0 in watch.calls)  # the forward's context (no x0 needed)
    # Two parts act in their listed order: (x + 1)·2 differs from x·2 + 1
    first, second = Recorder(lambda x: x + 1), Recorder(lambda x: x * 2)
    model_with(first, second)(idx)
    for (_, a, _), (_, b, _) in zip(first.calls, second.calls, strict=True):
        torch.testing.assert_close(b, a + 1)


def test_parts_declare_their_init_cast_and_fsdp_unit() -> None:
    """The record parts are found by type, in registration order; the bigram part declares
    its table an FSDP unit and its bf16 cast; the value gates theirs."""
    cfg = update(CFG, {"bigram.rows": 64, "bigram.dim": 8, "attention.xsa": "XX.",
                       "residual.x0_after_attention": True})  # fmt: skip
    model = GPT(cfg)
    assert [type(p).__name__ for p in model.parts()] == ["XSA", "X0Injection", "BigramHash"]
    assert model.fsdp_units()[1] is model.bigram.embed  # after the token table, before blocks
    assert model.points.after_attention == (model.x0_injection, model.bigram)
    assert model.points.after_heads == (model.xsa,)
    bf16 = GPT(update(cfg, {"numerics.dtype": "bf16"}))
    assert bf16.bigram.embed.weight.dtype == torch.bfloat16  # the part's own cast
    assert bf16.bigram.lambdas.dtype == torch.float32 and bf16.xsa.alphas.dtype == torch.float32


def test_a_part_without_reset_cannot_be_built() -> None:
    """init.py resets every part: one that does not say how is refused when built."""

    class Undrawn(Part):
        pass

    with pytest.raises(TypeError, match="reset"):
        Undrawn()
