"""The synthetic loader (data/loader.py): deterministic random tokens, split over ranks and
resumed like the token loader."""

import pytest
import torch

from data.synthetic import SyntheticLoader, synthetic_val_batches
from tests.unit.test_loader import _cat, _row_set

# ---- synthetic ---------------------------------------------------------------------------


def test_synthetic_is_deterministic_in_seed_and_step():
    a, b, c = (
        SyntheticLoader(4, 16, seed=1),
        SyntheticLoader(4, 16, seed=1),
        SyntheticLoader(4, 16, 2),
    )
    for _ in range(3):
        (xa, ya), (xb, yb), (xc, _) = a.next_batch(), b.next_batch(), c.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert not torch.equal(xa, xc)
        assert xa.dtype == torch.int64 and xa.shape == ya.shape == (4, 16)
        assert torch.equal(xa[:, 1:], ya[:, :-1])
        assert int(xa.min()) >= 0 and int(xa.max()) < 50257
    assert not torch.equal(SyntheticLoader(4, 16, 1).next_batch()[0], xa)  # steps differ


def test_synthetic_token_range_is_covered():
    x, y = SyntheticLoader(64, 256, seed=0).next_batch()
    tokens = torch.cat([x.flatten(), y[:, -1]])
    assert int(tokens.max()) > 50000 and int(tokens.min()) < 250


def test_synthetic_ranks_split_the_global_batch():
    single = SyntheticLoader(6, 8, seed=3)
    ranks = [SyntheticLoader(6, 8, seed=3, rank=r, world_size=3) for r in range(3)]
    for _ in range(4):
        x, y = single.next_batch()
        rx, ry = _cat(loader.next_batch() for loader in ranks)
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_synthetic_resume():
    reference = SyntheticLoader(2, 8, seed=5)
    batches = [reference.next_batch() for _ in range(6)]
    first = SyntheticLoader(2, 8, seed=5)
    for _ in range(4):
        first.next_batch()
    resumed = SyntheticLoader(2, 8, seed=5)
    resumed.load_state_dict(first.state_dict())
    assert first.state_dict() == {"step": 4}
    for x_ref, y_ref in batches[4:]:
        x, y = resumed.next_batch()
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)


def test_synthetic_batch_not_divisible():
    with pytest.raises(ValueError, match=r"train\.batch_size=5.*world size 2"):
        SyntheticLoader(5, 8, seed=0, world_size=2)


def test_synthetic_val_set():
    x1, y1 = _cat(synthetic_val_batches(seed=1, val_tokens=60, batch_size=1, seq_len=8))
    assert x1.shape == (7, 8)  # 60 // 8 sequences
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    x, y = _cat(synthetic_val_batches(1, 60, batch_size=3, seq_len=8))
    assert torch.equal(x, x1) and torch.equal(y, y1)
    per_rank = [list(synthetic_val_batches(1, 60, 3, 8, rank=r, world_size=2)) for r in range(2)]
    assert _row_set(b for batches in per_rank for b in batches) == _row_set([(x1, y1)])
    # A stream of its own: not the training batches, and the seed matters.
    train_x, _ = SyntheticLoader(7, 8, seed=1).next_batch()
    assert not torch.equal(train_x[0], x1[0])
    assert not torch.equal(_cat(synthetic_val_batches(2, 60, 7, 8))[0], x1)


def test_synthetic_takes_the_steps_length():
    a, b = SyntheticLoader(4, 8, seed=1), SyntheticLoader(4, 16, seed=1)
    assert torch.equal(a.next_batch(16)[0], b.next_batch()[0])  # a function of (seed, step, L)
    x, y = a.next_batch(5)
    assert x.shape == y.shape == (4, 5) and torch.equal(x[:, 1:], y[:, :-1])
