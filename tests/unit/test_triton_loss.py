"""model/triton_loss.py's kernel against model/record_loss.py's `record_loss_rows` (torch ops,
the reference), run by Triton's interpreter on the CPU (TRITON_INTERPRET=1, set before the
kernel is built): numpy, in fp32, the operations the kernel compiles to on a GPU.

The bound: in each row, G₈'s bytes are equal but for at most max(1, V/10⁴) of them
(`MAX_DIFFERING`), and where they differ, by one e5m2 step; the loss to a relative 1e-6. The
kernel's logsumexp adds in another order and its exp, tanh and ln are its own (the module's
docstring), so a value's last fp32 bit can differ, which moves it across an e5m2 (or, for σ,
a bf16) rounding boundary only rarely: on 1,600 rows of 1,000 logits and 32 rows of 50,304
drawn like these, with each g_s below, no byte differed (of 6.4 million) and the losses were
1.2e-7 apart at most. Rows of constant logits are compared bit for bit: there σ, ĉ, lse and p
are the reference's values.
"""

import pytest
import torch

pytest.importorskip("triton", reason="the Triton loss kernel needs triton (pip install triton)")

from model.config import HeadConfig
from model.mtp import shifted_targets
from model.record_loss import record_loss_rows
from model.triton_loss import available, record_loss_rows_triton

RECORD = HeadConfig(
    softcap=23.0, softcap_form="sigmoid", softcap_shift=5.0, softcap_divisor=7.5,
    loss="sigmoid_e5m2_grad", reduction="sum", fp8=True, mtp=True,
)  # fmt: skip
WEIGHTS = torch.tensor([1.0, 0.5, 0.2])
POW2_G, FIXED_G = 2.0**-19, 0.75 / 448  # g_s of fp8_scales=pow2 (saturates) and fixed_over_448
MAX_DIFFERING = 1e-4  # the share of a row's G₈ bytes that may differ (at least one)
LOSS_RTOL = 1e-6
E5M2_MAX_BYTE = 0x7B  # 57,344: satfinite's clamp


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def logits(rows: int, vocab: int, seed: int) -> torch.Tensor:
    """bf16 logits like the head's, N(0, 3²), with 1% at +60, 1% at −60 and 1% uniform in
    ±60: σ saturated both ways and, with POW2_G, G past 57,344."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, vocab, generator=gen) * 3
    spots = torch.rand(rows, vocab, generator=gen)
    z[spots < 0.01] = 60.0
    z[(spots >= 0.01) & (spots < 0.02)] = -60.0
    wide = spots >= 0.99
    z[wide] = torch.rand(int(wide.sum()), generator=gen) * 120 - 60
    return z.bfloat16()


def targets(sequences: int, length: int, vocab: int, k: int, seed: int) -> torch.Tensor:
    """Shifted targets of `sequences` rows of `length` positions: −1 at each one's last k − 1."""
    gen = torch.Generator().manual_seed(seed)
    return shifted_targets(torch.randint(0, vocab, (sequences, length), generator=gen), k)


def e5m2_order(g8: torch.Tensor) -> torch.Tensor:
    """Each e5m2 value's place on the line of e5m2 values (±0 both 0): one step apart = 1."""
    b = g8.view(torch.uint8).int()
    return torch.where(b >= 0x80, -(b & 0x7F), b)


def compare(
    z: torch.Tensor,
    shifted: torch.Tensor,
    weights: torch.Tensor,
    g_s: float,
    block: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Both losses and G₈ within the bound (per row, so a row's error cannot hide among the
    others); returns (reference G₈, the kernel's G₈)."""
    want_loss, want = record_loss_rows(z, shifted, weights, RECORD, g_s)
    loss, g8 = record_loss_rows_triton(z, shifted, weights, RECORD, g_s, block=block)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert g8.dtype == torch.float8_e5m2 and g8.shape == z.shape
    assert abs(loss.item() / want_loss.item() - 1) <= LOSS_RTOL, (loss, want_loss)
    differs = g8.float() != want.float()
    allowed = max(1, int(MAX_DIFFERING * z.size(1)))
    assert (differs.sum(dim=1) <= allowed).all(), differs.sum(dim=1)
    assert (e5m2_order(g8) - e5m2_order(want)).abs().max() <= 1
    return want, g8


def test_three_targets_with_dropped_terms() -> None:
    """K = 3 over two sequences of 4 positions (their last two drop terms; the gradient keeps
    S_w over all three weights there), V = 1,000 in a block of 1,024 (a masked tail), with
    pow2's g_s, which takes G past satfinite's clamp."""
    shifted = targets(2, 4, 1000, 3, seed=1)
    assert (shifted == -1).any()
    want, _ = compare(logits(8, 1000, seed=0), shifted, WEIGHTS, POW2_G, block=1024)
    assert ((want.view(torch.uint8) & 0x7F) == E5M2_MAX_BYTE).any()


def test_one_target() -> None:
    """K = 1 (no MTP), one term dropped, V = 1,000 in one block of 1,024."""
    shifted = targets(1, 4, 1000, 1, seed=2)
    shifted[3, 0] = -1
    want, got = compare(logits(4, 1000, seed=3), shifted, torch.tensor([1.0]), POW2_G, block=1024)
    # the dropped row still has S_w·p·…: a gradient, and the reference's
    assert got[3].float().abs().sum() > 0
    assert torch.equal(got[3].view(torch.uint8), want[3].view(torch.uint8))


def test_the_real_vocabulary() -> None:
    """V = 50,304 in blocks of 8,192 (6 and a tail of 1,152: the running maximum and sums
    rescaled from block to block; the default, 4,096, runs the same code in twice the
    interpreter's time), K = 3, with fixed_over_448's g_s (G within e5m2's range)."""
    shifted = targets(1, 2, 50304, 3, seed=5)
    want, got = compare(logits(2, 50304, seed=4), shifted, WEIGHTS, FIXED_G, block=8192)
    # measured: no byte differs at this size (the bound above allows 5 a row)
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


def test_constant_rows_give_the_reference_bit_for_bit() -> None:
    """A row of one logit z has one σ: the kernel's σ, ĉ, lse = ĉ + ln V and p = exp(−ln V) are
    the reference's values, so G₈ is the same bytes everywhere, for σ saturated at 0 and 1 (z =
    ±60), near the sigmoid's middle (z = −5) and in between; rows with dropped terms too,
    whose gradient scales p by all three weights (the quirk)."""
    values = [-60.0, -20.0, -7.5, -5.0, -0.3, 0.0, 2.75, 20.0, 60.0]
    z = torch.tensor(values).bfloat16()[:, None].expand(-1, 1000).contiguous()
    shifted = targets(3, 3, 1000, 3, seed=6)
    want_loss, want = record_loss_rows(z, shifted, WEIGHTS, RECORD, POW2_G)
    loss, g8 = record_loss_rows_triton(z, shifted, WEIGHTS, RECORD, POW2_G, block=1024)
    assert torch.equal(g8.view(torch.uint8), want.view(torch.uint8))
    assert abs(loss.item() / want_loss.item() - 1) <= LOSS_RTOL, (loss, want_loss)


def test_nan_stays_nan() -> None:
    """A NaN logit makes its row's loss and every G₈ of the row NaN, as in the reference (the
    clamp lets NaN through); the other row is unaffected."""
    z = logits(2, 64, seed=7)
    z[0, 5] = float("nan")
    shifted = targets(1, 2, 64, 1, seed=8)
    want_loss, want = record_loss_rows(z, shifted, torch.tensor([1.0]), RECORD, FIXED_G)
    loss, g8 = record_loss_rows_triton(z, shifted, torch.tensor([1.0]), RECORD, FIXED_G)
    assert want_loss.isnan() and loss.isnan()
    assert want[0].float().isnan().all() and g8[0].float().isnan().all()
    assert torch.equal(g8[1].view(torch.uint8), want[1].view(torch.uint8))


def test_available_says_why_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU tensors need the interpreter; with it, the kernel can run."""
    assert available("cpu") is None
    monkeypatch.delenv("TRITON_INTERPRET")
    reason = available("cpu")
    assert reason is not None and "TRITON_INTERPRET=1" in reason
    z = torch.zeros(1, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        record_loss_rows_triton(z, torch.zeros(1, 1, dtype=torch.long), WEIGHTS[:1], RECORD, 1.0)
