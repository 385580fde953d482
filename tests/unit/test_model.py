"""The GPT: causality, initial loss, parameter count, rotary, softcap, init."""

import math

import pytest
import torch

from model import GPT, ModelConfig
from model.rotary import Rotary

# The CPU's bf16 decides dtypes or tolerances here: CI reruns this file emulated.
pytestmark = pytest.mark.cpu_bf16

SMALL = ModelConfig(n_layer=2, n_head=2, n_embd=32)


def randomised(cfg: ModelConfig, seed: int = 0) -> GPT:
    """A model with every weight random, so zero-initialised layers can't hide a leak."""
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


def test_causal_future_tokens_do_not_change_past_logits() -> None:
    model = randomised(SMALL)
    x = torch.randint(0, 50257, (2, 16))
    t = 9
    x2 = x.clone()
    x2[:, t] = (x2[:, t] + 1234) % 50257
    with torch.no_grad():
        a, b = model(x), model(x2)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
    # The changed position itself must see the change, or the test proves nothing.
    assert (a[:, t] - b[:, t]).abs().max() > 1e-3


def test_initial_loss_is_log_vocab_with_zero_init() -> None:
    torch.manual_seed(0)
    model = GPT(SMALL)
    x = torch.randint(0, 50257, (4, 32))
    loss = model(x, x.roll(-1, 1)).item()
    assert abs(loss - math.log(SMALL.vocab_size)) < 0.1


def test_zero_initialised_projections_and_head() -> None:
    model = GPT(SMALL)
    for block in model.blocks:
        assert not block.attn.o.weight.any() and not block.mlp.proj.weight.any()
        assert block.attn.q.weight.std() > 0
    assert not model.lm_head.weight.any()
    assert model.lm_head.weight.data_ptr() != model.embed.weight.data_ptr()  # untied


def test_gpt2_124m_parameter_count() -> None:
    cfg = ModelConfig(n_layer=12, n_head=6, n_embd=768)
    with torch.device("meta"):
        model = GPT(cfg)
    n = sum(p.numel() for p in model.parameters())
    d, v = 768, 50304
    expected = 2 * v * d + 12 * (4 * d * d + 2 * d * 4 * d)  # embed + head + blocks
    print(f"gpt2_124m parameters: {n:,} ({(n - 2 * v * d) / 1e6:.1f}M outside embed/head)")
    assert n == expected == 162_201_600


def test_logits_are_softcapped_and_padded() -> None:
    model = randomised(SMALL)
    with torch.no_grad():
        model.lm_head.weight.mul_(100.0)
        logits = model(torch.randint(0, 50257, (1, 8)))
    assert logits.shape == (1, 8, 50304)
    assert logits.abs().max() <= SMALL.head.softcap
    assert logits.abs().max() > 0.9 * SMALL.head.softcap  # the cap is actually reached


def test_rotary_scores_depend_only_on_relative_position() -> None:
    rot = Rotary(head_dim=8)
    q = torch.randn(1, 1, 1, 8).expand(1, 12, 1, 8)
    k = torch.randn(1, 1, 1, 8).expand(1, 12, 1, 8)
    rq, rk = rot(q)[0, :, 0], rot(k)[0, :, 0]
    s = rq @ rk.T  # s[i, j] = <q at i, k at j>
    torch.testing.assert_close(s[5, 2], s[9, 6])
    torch.testing.assert_close(s[3, 3], s[11, 11])
    assert not torch.allclose(s[5, 2], s[5, 3])
    torch.testing.assert_close(rq.norm(dim=-1), q[0, :, 0].norm(dim=-1))  # a rotation


def test_bf16_autocast_close_to_fp32() -> None:
    model = randomised(SMALL)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.01)
    x = torch.randint(0, 50257, (1, 8))
    ref = model(x, x).item()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(x, x).item()
    assert low == pytest.approx(ref, rel=2e-2)


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"n_embd": 30, "n_head": 4}, "model.n_embd"),
        ({"n_embd": 36, "n_head": 12}, "head dim"),
        ({"n_layer": 0}, "model.n_layer"),
        ({"vocab_size": 1000}, "model.vocab_size"),
    ],
)
def test_bad_shapes_name_the_key(kwargs: dict, key: str) -> None:
    with pytest.raises(ValueError, match=key):
        GPT(ModelConfig(**kwargs))
