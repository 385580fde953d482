"""Deterministic token loaders for training and validation, rank-aware from the start.

Every rank computes the same global batch position and reads only its own rows, so the data a
step sees depends on the global batch alone, never on the world size: runs on 1 or 8 ranks see
the same tokens, and a checkpoint taken on one world size resumes on another.
"""

from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from data.passes import Passes
from data.token_shards import check_token_ids, load_shard, read_header
from data.tokenizer import EOT, GPT2_VOCAB_SIZE

Batch = tuple[torch.Tensor, torch.Tensor]

# The data.align choices whose rows are one window each (TokenLoader).
_ROW_ALIGNS = ("stream", "bos")


class NoBatch(ValueError):
    """No training shard can cut one global batch of the asked size: the shards are too small
    for train.batch_size and the sequence length (data/build.py adds what the corpus is)."""


def check_layout(batch_size: int, seq_len: int, rank: int, world_size: int) -> None:
    if batch_size < 1:
        raise ValueError(f"train.batch_size must be >= 1, got {batch_size}")
    if seq_len < 1:
        raise ValueError(f"train.seq_len must be >= 1, got {seq_len}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")


def check_divisible(batch_size: int, world_size: int) -> None:
    if batch_size % world_size:
        raise ValueError(
            f"train.batch_size={batch_size} (sequences per step, all ranks together) must be "
            f"divisible by the world size {world_size}"
        )


def _to_batch(tokens: np.ndarray, rows: int, seq_len: int) -> Batch:
    """Inputs and next-token targets from rows * seq_len + 1 consecutive tokens."""
    buf = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
    return buf[:-1].view(rows, seq_len), buf[1:].view(rows, seq_len)


class TokenLoader:
    """Consecutive global batches from a list of shards, read through memory maps.

    align="stream": a global batch of `batch_size` sequences is the next
    batch_size * seq_len + 1 tokens of the current shard. align="bos": each row starts at the
    next document start (an EOT token) at or after where the previous row's inputs ended, so
    every row begins with <|endoftext|>; what is left of a document that overflows a row is
    skipped. Either way rank r takes its contiguous share of the rows, batches never overlap,
    and a shard whose rest is too short for a whole batch is left for the next one; after the
    last shard the stream wraps around and `epoch` counts up. Each shard's token ids are
    checked against the GPT-2 vocabulary when it is first opened.
    """

    def __init__(
        self,
        files: Sequence[Path],
        batch_size: int,
        seq_len: int,
        rank: int = 0,
        world_size: int = 1,
        align: str = "stream",
    ) -> None:
        check_layout(batch_size, seq_len, rank, world_size)
        check_divisible(batch_size, world_size)
        if not files:
            raise ValueError("no training shards given")
        if align not in _ROW_ALIGNS:
            # align=pieces packs several documents per row: data.pieces.PieceLoader reads it.
            raise ValueError(f"TokenLoader cuts data.align in {_ROW_ALIGNS}, got {align!r}")
        self.align = align
        self.files = [Path(f) for f in files]
        self.batch_size, self.seq_len = batch_size, seq_len
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = batch_size // world_size
        span = batch_size * seq_len  # tokens consumed per step, all ranks together
        # Headers only: validates every shard up front without reading its tokens.
        self._lengths = [read_header(f) for f in self.files]
        if max(self._lengths) < span + 1:
            raise NoBatch(
                f"no training shard holds one global batch: train.batch_size={batch_size} x "
                f"train.seq_len={seq_len} needs {span + 1} tokens, the largest of "
                f"{[str(f) for f in self.files]} has {max(self._lengths)}"
            )
        self._shard, self._pos, self.epoch = 0, 0, 0
        self.passes = Passes(rank == 0)  # tokens served per pass; a wrap is logged
        self._tokens: np.ndarray | None = None  # memory map of the current shard
        self._bos: np.ndarray | None = None  # positions of EOT in it (align="bos")
        self._next: np.ndarray | None = None  # the row after a row starting at _bos[j]
        self._open()  # the first shard's token ids are checked before any training

    def _open(self) -> np.ndarray:
        if self._tokens is None:
            path = self.files[self._shard]
            self._tokens = load_shard(path)
            check_token_ids(path, self._tokens, GPT2_VOCAB_SIZE)
            if self.align == "bos":
                # Once per shard: the EOT positions, and for a row starting at the j-th, the
                # index of the EOT where the next row starts (the first at or after its end).
                self._bos = np.flatnonzero(self._tokens == EOT)
                self._next = np.searchsorted(self._bos, self._bos + self.seq_len)
        return self._tokens

    def _advance_shard(self) -> None:
        self._shard, self._pos = self._shard + 1, 0
        self._tokens = self._bos = self._next = None
        if self._shard == len(self.files):
            self._shard, self.epoch = 0, self.epoch + 1
            self.passes.wrapped(self.epoch, len(self.files))

    def next_batch(self, seq_len: int | None = None) -> Batch:
        """This rank's (inputs, targets), int64 tensors of shape (batch_size // world, L).

        L is `seq_len`, or train.seq_len when None. The stream takes any L a shard can hold;
        align=bos cuts rows of train.seq_len only (its row index is built for that length).
        """
        seq_len = self._step_length(seq_len)
        rows = self.local_batch_size
        if self.align == "bos":
            starts = self._next_bos_starts()
            mine = starts[self.rank * rows : (self.rank + 1) * rows]
            cut = self._open()[mine[:, None] + np.arange(self.seq_len + 1)]  # one gather
            buf = torch.from_numpy(cut.astype(np.int64))
            return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()
        start = self._next_stream_start(seq_len) + self.rank * rows * seq_len
        return _to_batch(self._open()[start : start + rows * seq_len + 1], rows, seq_len)

    def advance(self, seq_len: int | None = None) -> None:
        """Move past the next global batch as `next_batch` would, without reading its tokens
        (data/passes.py plans a run's passes with it)."""
        seq_len = self._step_length(seq_len)
        if self.align == "bos":
            self._next_bos_starts()
        else:
            self._next_stream_start(seq_len)

    def _step_length(self, seq_len: int | None) -> int:
        seq_len = self.seq_len if seq_len is None else seq_len
        if seq_len < 1:
            raise ValueError(f"the step's sequence length must be >= 1, got {seq_len}")
        if self.align == "bos" and seq_len != self.seq_len:
            raise ValueError(
                f"data.align=bos cuts rows of train.seq_len={self.seq_len} only, the step "
                f"asked for {seq_len}; data.align=pieces takes a length per step"
            )
        return seq_len

    def _next_stream_start(self, seq_len: int) -> int:
        """Where the next global batch of the stream starts in the current shard."""
        span = self.batch_size * seq_len
        if span + 1 > max(self._lengths):  # else the loop below would never end
            raise NoBatch(
                f"no training shard holds one global batch of train.batch_size="
                f"{self.batch_size} x {seq_len} tokens (+1), the largest has "
                f"{max(self._lengths)}"
            )
        while self._pos + span + 1 > self._lengths[self._shard]:
            self._advance_shard()
        start, self._pos = self._pos, self._pos + span
        self.passes.served(span)
        return start

    def _next_bos_starts(self) -> np.ndarray:
        for _ in range(len(self.files) + 1):
            starts = self._row_starts()
            if starts is not None:
                break
            self._advance_shard()
        else:
            raise NoBatch(
                f"no training shard holds {self.batch_size} document-aligned rows of "
                f"{self.seq_len + 1} tokens (data.align=bos): {[str(f) for f in self.files]}"
            )
        self.passes.served(self.batch_size * self.seq_len)
        return starts

    def _row_starts(self) -> np.ndarray | None:
        """The global batch's row starts in the current shard (None: the shard runs out).

        Row i starts at the first EOT at or after the end of row i-1's inputs; every rank
        computes all of them, so the rows (and the position after them) agree everywhere.
        """
        self._open()
        bos, nxt, length = self._bos, self._next, self._lengths[self._shard]
        assert bos is not None and nxt is not None
        j = int(np.searchsorted(bos, self._pos))
        starts = np.empty(self.batch_size, dtype=np.int64)
        for i in range(self.batch_size):
            if j == len(bos) or bos[j] + self.seq_len + 1 > length:
                return None
            starts[i] = bos[j]
            j = int(nxt[j])
        pos = starts[-1] + self.seq_len
        self._pos = int(pos)
        return starts

    def state_dict(self) -> dict[str, int]:
        """The global stream position: the same on every rank, independent of the world size."""
        return {"shard": self._shard, "pos": self._pos, "epoch": self.epoch, **self.passes.state()}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue exactly where `state_dict()` was taken."""
        shard, pos, epoch = int(state["shard"]), int(state["pos"]), int(state["epoch"])
        if not 0 <= shard < len(self.files) or not 0 <= pos <= self._lengths[shard] or epoch < 0:
            raise ValueError(
                f"loader state {state} does not fit the {len(self.files)} training shards "
                "(were the shards changed since the checkpoint?)"
            )
        self._shard, self._pos, self.epoch = shard, pos, epoch
        self.passes.load(state)
        self._tokens = self._bos = self._next = None


def val_row_ranges(
    n_seq: int, batch_size: int, rank: int, world_size: int
) -> Iterator[tuple[int, int]]:
    """This rank's [first, last) sequence indices of each global validation batch, if any.

    Each global batch's rows are split into near-equal contiguous shares, so the union over
    ranks is exactly the single-rank set. A rank with no rows in a small last batch gets nothing.
    """
    for start in range(0, n_seq, batch_size):
        rows = min(batch_size, n_seq - start)
        lo = start + rows * rank // world_size
        hi = start + rows * (rank + 1) // world_size
        if hi > lo:
            yield lo, hi


def val_sequence_count(files: Sequence[Path], val_tokens: int, seq_len: int) -> int:
    """How many sequences of seq_len the validation budget holds (val_tokens rounded down).

    Raises if the validation shards cannot supply them, before any training is done.
    """
    if seq_len < 1:
        raise ValueError(f"train.seq_len must be >= 1, got {seq_len}")
    if not files:
        raise ValueError("no validation shards given")
    available = sum(read_header(f) for f in files)
    names = [str(f) for f in files]
    if available < seq_len + 1:
        raise ValueError(
            f"validation shards {names} hold {available} tokens, fewer than one sequence of "
            f"train.seq_len={seq_len} plus its target ({seq_len + 1})"
        )
    n_seq = val_tokens // seq_len
    if n_seq < 1:
        raise ValueError(
            f"train.val_tokens={val_tokens} is less than one sequence of train.seq_len={seq_len}"
        )
    if n_seq * seq_len + 1 > available:
        raise ValueError(
            f"train.val_tokens={val_tokens} needs {n_seq * seq_len + 1} validation tokens but "
            f"{names} hold only {available}; lower train.val_tokens"
        )
    return n_seq


def val_batches(
    files: Sequence[Path],
    val_tokens: int,
    batch_size: int,
    seq_len: int,
    rank: int = 0,
    world_size: int = 1,
) -> Iterator[Batch]:
    """This rank's share of the fixed validation set: the first val_tokens of the val stream.

    The set (val_tokens // seq_len sequences) does not depend on batch_size or world_size, but
    ranks may get different row counts, some none. For a loss identical on every layout,
    accumulate (sum of token losses, token count) per rank and all-reduce both once at the end,
    rather than averaging per-batch means.
    """
    # Validate now, not on the first next(): a bad budget must fail before training starts.
    check_layout(batch_size, seq_len, rank, world_size)
    n_seq = val_sequence_count(files, val_tokens, seq_len)
    stream = _read_prefix(files, n_seq * seq_len + 1)
    check_token_ids(", ".join(str(f) for f in files), stream, GPT2_VOCAB_SIZE)
    ranges = val_row_ranges(n_seq, batch_size, rank, world_size)
    return (
        _to_batch(stream[lo * seq_len : hi * seq_len + 1], hi - lo, seq_len) for lo, hi in ranges
    )


def _read_prefix(files: Sequence[Path], n_tokens: int) -> np.ndarray:
    """The first n_tokens of the shards' concatenated stream (sequences may span shards)."""
    parts, needed = [], n_tokens
    for f in files:
        if needed == 0:
            break
        part = load_shard(f)[:needed]
        parts.append(part)
        needed -= len(part)
    return np.concatenate(parts)
