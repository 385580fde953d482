"""Uniformly random tokens with the loaders' interface (data.source=synthetic): for speed
and smoke runs that need no data. Each batch is a function of (seed, step) alone, so resume
and any world size see exactly the same tokens."""

from collections.abc import Iterator

import numpy as np
import torch

from data.loader import Batch, check_divisible, check_layout, val_row_ranges
from data.passes import Passes
from data.tokenizer import GPT2_VOCAB_SIZE

# Training and validation draw from separate random streams of one seed.
_TRAIN_STREAM, _VAL_STREAM = 0, 1


def check_seed(seed: int) -> None:
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")


def _generator(seed: int, stream: int, index: int) -> torch.Generator:
    # SeedSequence mixes (seed, stream, index) so that nearby seeds give unrelated streams.
    state = np.random.SeedSequence([seed, stream, index]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def _random_tokens(seed: int, stream: int, index: int, shape: tuple[int, ...]) -> torch.Tensor:
    generator = _generator(seed, stream, index)
    return torch.randint(0, GPT2_VOCAB_SIZE, shape, generator=generator, dtype=torch.int64)


class SyntheticLoader:
    """Uniformly random tokens: the TokenLoader interface with no data, for speed and smoke runs.

    Each global batch is a function of (seed, step) alone, so resume and any world size see
    exactly the same tokens.
    """

    def __init__(
        self, batch_size: int, seq_len: int, seed: int, rank: int = 0, world_size: int = 1
    ) -> None:
        check_layout(batch_size, seq_len, rank, world_size)
        check_divisible(batch_size, world_size)
        check_seed(seed)
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = batch_size // world_size
        self.step = 0
        self.epoch = 0  # fresh tokens every step: never a second pass
        self.passes = Passes(announce=False)

    def next_batch(self, seq_len: int | None = None) -> Batch:
        """This rank's (inputs, targets), int64 tensors of shape (batch_size // world, L), with
        L = `seq_len`, or train.seq_len when None."""
        seq_len = self.seq_len if seq_len is None else seq_len
        if seq_len < 1:
            raise ValueError(f"the step's sequence length must be >= 1, got {seq_len}")
        tokens = _random_tokens(self.seed, _TRAIN_STREAM, self.step, (self.batch_size, seq_len + 1))
        self.step += 1
        rows = tokens[self.rank * self.local_batch_size : (self.rank + 1) * self.local_batch_size]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def advance(self, seq_len: int | None = None) -> None:
        """Move past the next global batch without drawing it."""
        self.step += 1

    def state_dict(self) -> dict[str, int]:
        """The global step: all there is to resume, on any world size."""
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue exactly where `state_dict()` was taken."""
        self.step = int(state["step"])


def synthetic_val_batches(
    seed: int,
    val_tokens: int,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[Batch]:
    """The synthetic counterpart of `val_batches`, from a stream separate from training.

    Sequence j is drawn from (seed, j) alone, so the set is the same for any batch size and
    world size; average losses the way `val_batches` says.
    """
    check_layout(batch_size, seq_len, rank, world_size)
    check_seed(seed)
    n_seq = val_tokens // seq_len
    if n_seq < 1:
        raise ValueError(
            f"train.val_tokens={val_tokens} is less than one sequence of train.seq_len={seq_len}"
        )
    ranges = val_row_ranges(n_seq, batch_size, rank, world_size)
    return (_synthetic_val_rows(seed, seq_len, lo, hi) for lo, hi in ranges)


def _synthetic_val_rows(seed: int, seq_len: int, lo: int, hi: int) -> Batch:
    rows = torch.stack(
        [_random_tokens(seed, _VAL_STREAM, j, (seq_len + 1,)) for j in range(lo, hi)]
    )
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()
