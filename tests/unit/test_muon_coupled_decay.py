"""Coupled (L2) weight decay, `optim.muon.weight_decay_form=coupled`: λ·W joins the gradient
before the momentum, G ← G + λ·W, and the step itself has no decay term. The reference is the
definition: Muon without decay fed G + λ·W as its gradient, in float64, per parameter and over
banks (the compiled step's arithmetic, run eagerly)."""

import pytest
import torch

from optim.config import MuonConfig
from optim.muon.optimizer import Muon
from tests.helpers import compose_config
from trainer.config import to_config

SHAPES = [(16, 16), (32, 16), (16, 16), (16, 24)]  # a bank of two, a tall one, a wide one
DECAY, STEPS = 0.4, 3


def run(decay: float, form: str, banks: bool, add_decay_to_grads: float = 0.0):
    """STEPS Muon steps on float64 matrices from a fixed draw; `add_decay_to_grads`: feed
    G + that·W as the gradient (the reference)."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen, dtype=torch.float64) / 4)
              for s in SHAPES]  # fmt: skip
    hp = MuonConfig(weight_decay=decay, weight_decay_form=form, lr=0.05)
    opt = Muon(params, hp, ns_dtype=torch.float64, banks=banks)
    for _ in range(STEPS):
        for p in params:
            g = torch.randn(p.shape, generator=gen, dtype=torch.float64)
            p.grad = g.add(p.detach(), alpha=add_decay_to_grads) if add_decay_to_grads else g
        opt.step()
    return [p.detach().clone() for p in params]


@pytest.mark.parametrize("banks", [False, True], ids=["per_parameter", "banks"])
def test_coupled_decay_is_muon_on_the_decayed_gradient(banks: bool) -> None:
    got = run(DECAY, "coupled", banks)
    want = run(0.0, "decoupled", banks, add_decay_to_grads=DECAY)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    # The check sees the decay: without it, and decoupled instead, the weights differ.
    for wrong in (run(0.0, "decoupled", banks), run(DECAY, "decoupled", banks)):
        assert max((a - b).abs().max().item() for a, b in zip(got, wrong, strict=True)) > 1e-4


def test_coupled_is_a_choice_of_the_config() -> None:
    keys = ["optim.muon.weight_decay=0.1", "optim.muon.weight_decay_form=coupled", "run_dir=."]
    cfg = to_config(compose_config(keys))
    assert cfg.optim.muon.weight_decay_form == "coupled"
    with pytest.raises(ValueError, match="weight_decay_form"):
        MuonConfig(weight_decay_form="l3").validate()
