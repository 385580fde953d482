"""Muon's custom Newton–Schulz table (`ns_custom`, `ns_custom_norm_scale`) and `extra_scale`.

One fp64 step from zero momentum is checked against an independent float64 reference of the
specified formulas (normalise by ‖u‖_F·scale + eps, iterate on the wide side, the table's last
tuple repeated, decoupled decay left unscaled by the shape factor and `extra_scale`); the named
tables are checked bit for bit against their custom spelling, banks against no banks, the
construction-time validation, and the keys' path through the trainer's config.
"""

import math
import re

import pytest
import torch

from optim.muon.optimizer import Muon
from tests.helpers import compose_config
from trainer.config import to_config

F64 = torch.float64
CLASSIC = [(3.4445, -4.7750, 2.0315)]
POLAR_EXPRESS = [
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
]
CUSTOM = [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5)]


def newton_schulz(u: torch.Tensor, table: list, norm_scale: float, steps: int) -> torch.Tensor:
    """The specified iteration, written out: wide side, last tuple repeated, eps 1e-7."""
    tall = u.shape[0] > u.shape[1]
    x = u.mT if tall else u
    x = x / (x.norm() * norm_scale + 1e-7)
    for k in range(steps):
        a, b, c = table[min(k, len(table) - 1)]
        gram = x @ x.mT
        x = a * x + b * gram @ x + c * gram @ gram @ x
    return x.mT if tall else x


def reference_step(
    w: torch.Tensor, g: torch.Tensor, *, lr: float, momentum: float, weight_decay: float,
    table: list, norm_scale: float, steps: int, extra: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """One step from zero momentum, no Nesterov, lr_scale="original", decoupled decay."""
    o = newton_schulz((1 - momentum) * g, table, norm_scale, steps)
    s = math.sqrt(max(1.0, w.shape[0] / w.shape[1]))
    return w * (1 - lr * weight_decay) - lr * s * extra * o


def problem(shapes: list[tuple[int, int]], seed: int = 0) -> tuple[list, list]:
    gen = torch.Generator().manual_seed(seed)
    ws = [torch.randn(s, generator=gen, dtype=F64) for s in shapes]
    return ws, [torch.randn(s, generator=gen, dtype=F64) for s in shapes]


def muon_step(ws: list[torch.Tensor], gs: list[torch.Tensor], **settings: object) -> list:
    """Copies of `ws` after one fp64 Muon step on gradients `gs`."""
    ps = [torch.nn.Parameter(w.clone()) for w in ws]
    opt = Muon(ps, ns_dtype=F64, **settings)
    for p, g in zip(ps, gs, strict=True):
        p.grad = g.clone()
    opt.step()
    return [p.detach() for p in ps]


def as_lists(table: list) -> list[list[float]]:
    return [list(row) for row in table]


def test_custom_table_matches_formula() -> None:
    ws, gs = problem([(6, 10), (12, 5)])
    kw = {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1}
    new = muon_step(
        ws, gs, nesterov=False, lr_scale="original", ns_steps=4, ns_coefficients="custom",
        ns_custom=as_lists(CUSTOM), ns_custom_norm_scale=1.05, **kw,
    )  # fmt: skip
    for w, g, got in zip(ws, gs, new, strict=True):
        want = reference_step(w, g, table=CUSTOM, norm_scale=1.05, steps=4, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("name", "table", "norm_scale", "steps"),
    [("classic", CLASSIC, 1.0, 5), ("polar_express", POLAR_EXPRESS, 1.02, 5)],
)
def test_named_table_equals_its_custom_spelling(
    name: str, table: list, norm_scale: float, steps: int
) -> None:
    ws, gs = problem([(6, 10), (12, 5), (8, 8)], seed=1)
    kw = {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.1, "ns_steps": steps}
    named = muon_step(ws, gs, ns_coefficients=name, **kw)
    custom = muon_step(
        ws, gs, ns_coefficients="custom", ns_custom=as_lists(table),
        ns_custom_norm_scale=norm_scale, **kw,
    )  # fmt: skip
    for a, b in zip(named, custom, strict=True):
        assert torch.equal(a, b)


def test_custom_table_banks_agree() -> None:
    ws, gs = problem([(6, 10), (6, 10), (12, 5)], seed=2)
    kw = {
        "lr": 0.05, "momentum": 0.5, "weight_decay": 0.1, "ns_steps": 4,
        "ns_coefficients": "custom", "ns_custom": as_lists(CUSTOM), "ns_custom_norm_scale": 1.05,
    }  # fmt: skip
    banked = muon_step(ws, gs, banks=True, **kw)
    plain = muon_step(ws, gs, banks=False, **kw)
    for a, b in zip(banked, plain, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_extra_scale_matches_formula() -> None:
    ws, gs = problem([(12, 5), (5, 12)], seed=3)
    kw = {"lr": 0.05, "momentum": 0.0, "weight_decay": 0.1}
    new = muon_step(
        ws, gs, nesterov=False, lr_scale="original", ns_steps=5, ns_coefficients="classic",
        extra_scale=0.37, **kw,
    )  # fmt: skip
    for w, g, got in zip(ws, gs, new, strict=True):
        want = reference_step(w, g, table=CLASSIC, norm_scale=1.0, steps=5, extra=0.37, **kw)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_extra_scale_one_is_the_default_and_scaling_is_linear() -> None:
    ws, gs = problem([(12, 5), (5, 12), (8, 8)], seed=4)
    kw = {"lr": 0.05, "momentum": 0.5, "lr_scale": "original"}
    default = muon_step(ws, gs, weight_decay=0.1, **kw)
    one = muon_step(ws, gs, weight_decay=0.1, extra_scale=1.0, **kw)
    for a, b in zip(default, one, strict=True):
        assert torch.equal(a, b)
    x1 = muon_step(ws, gs, weight_decay=0.0, extra_scale=1.0, **kw)
    x2 = muon_step(ws, gs, weight_decay=0.0, extra_scale=2.0, **kw)
    for w0, a, b in zip(ws, x1, x2, strict=True):
        torch.testing.assert_close(b - w0, 2 * (a - w0), rtol=0, atol=1e-12)


ONE_ROW = {"ns_coefficients": "custom", "ns_custom": [[3.0, -3.2, 1.2]]}


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"ns_coefficients": "custom", "ns_custom": []}, "optim.muon.ns_custom"),
        ({**ONE_ROW, "ns_coefficients": "classic"}, "optim.muon.ns_custom"),
        ({**ONE_ROW, "ns_custom": [[1.0, 2.0]]}, "optim.muon.ns_custom[0]"),
        (
            {**ONE_ROW, "ns_custom": [[3.0, -3.2, 1.2], [1.0, math.nan, 0.0]]},
            "optim.muon.ns_custom[1]",
        ),
        ({**ONE_ROW, "ns_custom": as_lists(CUSTOM), "ns_steps": 1}, "optim.muon.ns_custom"),
        ({**ONE_ROW, "ns_custom_norm_scale": 0.0}, "optim.muon.ns_custom_norm_scale"),
        ({**ONE_ROW, "ns_custom_norm_scale": -1.0}, "optim.muon.ns_custom_norm_scale"),
        ({"extra_scale": 0.0}, "optim.muon.extra_scale"),
        ({"extra_scale": -0.5}, "optim.muon.extra_scale"),
        ({"extra_scale": math.inf}, "optim.muon.extra_scale"),
    ],
)
def test_bad_settings_rejected(settings: dict, key: str) -> None:
    """Each names its key (`(?!_)`: not merely as the prefix of ns_custom_norm_scale)."""
    with pytest.raises(ValueError, match=re.escape(key) + "(?!_)"):
        Muon([torch.nn.Parameter(torch.zeros(4, 6, dtype=F64))], ns_dtype=F64, **settings)


def test_config_keys_reach_muon_and_are_checked() -> None:
    conf = to_config(
        compose_config(
            [
                "optim.muon.ns_coefficients=custom",
                "optim.muon.ns_custom=[[3.4445,-4.775,2.0315]]",
                "optim.muon.extra_scale=0.5",
                "run_dir=.",
            ]
        )
    )
    assert conf.optim.muon.ns_custom == [[3.4445, -4.775, 2.0315]]
    assert conf.optim.muon.extra_scale == 0.5
    with pytest.raises(ValueError, match=re.escape("optim.muon.ns_custom")):
        to_config(compose_config(["optim.muon.ns_coefficients=custom", "run_dir=."]))
