"""Training rows packed from document pieces (data.align=pieces): record_2025_11_29's batching.

A global step of R sequences (train.batch_size, all ranks together) with per-rank length L cuts
R buffers of exactly L+1 tokens, in row order, from the current shard. Each shard's document
starts (its <|endoftext|> tokens, the BOS) are indexed once, with a cursor k into that list.
A buffer is filled by repeatedly taking the BOS at index k as a piece start c, ending the piece
at e = min(the next BOS or the shard end, c + max_piece_len, c + what the buffer still needs),
appending tokens [c, e) and advancing k. So every piece starts with its BOS, a document keeps
at most its first max_piece_len tokens, and the piece that fills a buffer is cut, the rest of
its document discarded: the next buffer starts at the next BOS. Inputs are buffer[0:L],
targets buffer[1:L+1]. When the shard's remaining pieces cannot fill all R buffers, the whole
batch is discarded and rebuilt from the next shard's first BOS (after the last shard, the
first again, and `epoch` counts up); tokens before a shard's first BOS are never read.

Segments need no extra output: every piece starts with the only BOS it holds, so the model's
document rule (a document starts at every BOS, model/masks.py) gives exactly the pieces.

Every rank computes the whole global batch's cut, which is index arithmetic on the BOS list,
and gathers only its own rows, so the documents and their order do not depend on the world
size, and the state (shard, cursor, epoch) resumes on any world size.

Where record_2025_11_29's batching (docs/records.md, C.5) leaves room, this reads it so: a shard
"cannot fill the whole batch" when the fill needs a piece at a cursor past the last BOS (the
last document, running to the shard end, may serve); the discard rule is the global batch's,
so shard ends fall at the same place on every world size too (the record only promises that
away from shard ends); a shard without any BOS is skipped like a short one; inputs come back
int64, like the targets (narrowing them is the consumer's choice).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from data.loader import Batch, NoBatch, check_divisible, check_layout
from data.passes import Passes
from data.token_shards import check_token_ids, load_shard, read_header
from data.tokenizer import EOT, GPT2_VOCAB_SIZE


@dataclass(frozen=True)
class ShardPieces:
    """The document pieces of one shard, in order, before any buffer cuts them.

    Piece j starts at the j-th BOS, `starts[j]`, and runs `lengths[j]` tokens: to the next BOS
    (or the shard end), at most max_piece_len. `ends[j]` is the total length of pieces 0..j-1,
    so that a buffer's pieces are found by one binary search instead of a walk.
    """

    starts: np.ndarray  # int64, the BOS positions
    lengths: np.ndarray  # int64, each >= 1
    ends: np.ndarray  # int64, len(starts) + 1 cumulative lengths, ends[0] = 0

    @classmethod
    def index(cls, tokens: np.ndarray, max_piece_len: int) -> "ShardPieces":
        """One pass over a shard's tokens (a memory map: nothing else of it is copied)."""
        starts = np.flatnonzero(tokens == EOT).astype(np.int64)
        following = np.empty_like(starts)  # the next BOS, or the shard end for the last
        following[:-1], following[-1:] = starts[1:], len(tokens)
        lengths = np.minimum(following - starts, max_piece_len)
        ends = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(lengths, out=ends[1:])
        return cls(starts, lengths, ends)

    def __len__(self) -> int:
        return len(self.starts)

    def cursors(self, k: int, rows: int, row_len: int) -> np.ndarray | None:
        """The cursor at the start of each of `rows` buffers of `row_len` tokens from piece k,
        then the one after the last (rows + 1 values); None when the pieces run out first.

        Buffer i holds pieces cursors[i] .. cursors[i+1]-1, the last of them cut to fit.
        """
        out = np.empty(rows + 1, dtype=np.int64)
        out[0] = k
        for i in range(rows):
            # The first piece whose end reaches the buffer's last token fills the buffer.
            filler = int(np.searchsorted(self.ends, self.ends[k] + row_len, side="left")) - 1
            if filler >= len(self):
                return None
            k = filler + 1
            out[i + 1] = k
        return out

    def row_pieces(self, first: int, stop: int, row_len: int) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) of the pieces first..stop-1 that fill one buffer of row_len."""
        starts = self.starts[first:stop]
        lengths = self.lengths[first:stop].copy()
        lengths[-1] = row_len - (self.ends[stop - 1] - self.ends[first])  # the cut piece
        return starts, lengths


def gather_rows(
    tokens: np.ndarray, pieces: ShardPieces, cursors: np.ndarray, row_len: int
) -> np.ndarray:
    """The buffers between consecutive `cursors`, stacked: (len(cursors) - 1, row_len) int64.

    One fancy-index read of the memory map: only the pieces' tokens are touched.
    """
    index = np.empty((len(cursors) - 1, row_len), dtype=np.int64)
    for i in range(len(cursors) - 1):
        starts, lengths = pieces.row_pieces(int(cursors[i]), int(cursors[i + 1]), row_len)
        offsets = np.cumsum(lengths) - lengths  # where each piece begins inside the buffer
        index[i] = np.repeat(starts - offsets, lengths) + np.arange(row_len)
    return tokens[index].astype(np.int64)


class PieceLoader:
    """Global batches of packed document pieces from a list of shards (see the module doc).

    The same interface as TokenLoader, except that `next_batch` takes the step's length L
    (record_2025_11_29 grows it during the run), and may take the step's piece cap and piece limit
    (record_2026_07_17's by stage); rank r of W gets buffers r*R/W .. (r+1)*R/W - 1.
    """

    def __init__(
        self,
        files: Sequence[Path],
        batch_size: int,
        seq_len: int,
        max_piece_len: int,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        check_layout(batch_size, seq_len, rank, world_size)
        check_divisible(batch_size, world_size)
        if max_piece_len < 1:
            raise ValueError(
                f"data.max_piece_len must be >= 1 with data.align=pieces, got {max_piece_len}"
            )
        if not files:
            raise ValueError("no training shards given")
        self.files = [Path(f) for f in files]
        self.batch_size, self.seq_len, self.max_piece_len = batch_size, seq_len, max_piece_len
        self.rank, self.world_size = rank, world_size
        self.local_batch_size = batch_size // world_size
        # Headers only: pieces never overlap, so a shard shorter than R*(L+1) cannot serve.
        self._lengths = [read_header(f) for f in self.files]
        need = batch_size * (seq_len + 1)
        if max(self._lengths) < need:
            raise NoBatch(
                f"no training shard holds one global batch: train.batch_size={batch_size} "
                f"buffers of train.seq_len={seq_len} + 1 tokens need {need}, the largest of "
                f"{[str(f) for f in self.files]} has {max(self._lengths)}"
            )
        self._shard, self._k, self.epoch = 0, 0, 0
        self.passes = Passes(rank == 0)  # tokens served per pass; a wrap is logged
        self._cap = max_piece_len  # the cap the current pieces were cut with
        self._tokens: np.ndarray | None = None  # memory map of the current shard
        self._pieces: ShardPieces | None = None  # and its pieces
        self._open()  # the first shard's token ids are checked before any training
        self._check_some_shard_serves(seq_len)

    def _open(self) -> tuple[np.ndarray, ShardPieces]:
        if self._tokens is None:
            path = self.files[self._shard]
            tokens = load_shard(path)
            check_token_ids(path, tokens, GPT2_VOCAB_SIZE)
            self._tokens, self._pieces = tokens, None
        if self._pieces is None:  # a new shard, or a new cap: the BOS cursor keeps its meaning
            self._pieces = ShardPieces.index(self._tokens, self._cap)
        return self._tokens, self._pieces

    def _check_some_shard_serves(self, seq_len: int) -> None:
        """Fail now, not at the first step, if no shard can fill one batch of seq_len.

        Usually the first shard answers; only when it cannot are the others indexed.
        """
        _, first = self._open()
        if first.cursors(0, self.batch_size, seq_len + 1) is not None:
            return
        for f in self.files[1:]:
            pieces = ShardPieces.index(load_shard(f), self.max_piece_len)
            if pieces.cursors(0, self.batch_size, seq_len + 1) is not None:
                return
        raise self._no_batch(seq_len)

    def _no_batch(self, seq_len: int) -> ValueError:
        """The error when no shard can fill one batch of seq_len (a slow path: it rescans)."""
        names = [str(f) for f in self.files]
        if not any((load_shard(f) == EOT).any() for f in self.files):
            return ValueError(
                f"no training shard holds a document start (token {EOT}), which "
                f"data.align=pieces cuts at: {names}"
            )
        return NoBatch(
            f"no training shard holds train.batch_size={self.batch_size} buffers of "
            f"{seq_len + 1} tokens packed from documents of at most "
            f"data.max_piece_len={self.max_piece_len} tokens (data.align=pieces): {names}"
        )

    def _advance_shard(self) -> None:
        self._shard, self._k = self._shard + 1, 0
        self._tokens = self._pieces = None
        if self._shard == len(self.files):
            self._shard, self.epoch = 0, self.epoch + 1
            self.passes.wrapped(self.epoch, len(self.files))

    def next_batch(
        self, seq_len: int | None = None, max_piece_len: int | None = None, max_pieces: int = 0
    ) -> Batch:
        """This rank's (inputs, targets), int64 tensors of shape (batch_size // world, L).

        L is this step's per-rank length, `seq_len`, or train.seq_len when None;
        `max_piece_len`: this step's piece cap (its stage's, train.stages.rows.N.max_piece_len),
        else the last one asked for (initially data.max_piece_len); `max_pieces`: the most
        pieces a buffer may hold (train.stages.rows.N.max_pieces), 0 = no limit; the trainer
        reads both from the step's row of the stage table. The limit is checked on the whole
        global batch, so every rank fails at the same step, before the batch is consumed.
        """
        tokens, pieces, cursors, row_len = self._cut(seq_len, max_piece_len, max_pieces)
        lo = self.rank * self.local_batch_size
        mine = cursors[lo : lo + self.local_batch_size + 1]
        buf = torch.from_numpy(gather_rows(tokens, pieces, mine, row_len))
        return buf[:, :-1].contiguous(), buf[:, 1:].contiguous()

    def advance(
        self, seq_len: int | None = None, max_piece_len: int | None = None, max_pieces: int = 0
    ) -> None:
        """Move past the next global batch as `next_batch` would, without reading its tokens
        (data/passes.py plans a run's passes with it)."""
        self._cut(seq_len, max_piece_len, max_pieces)

    def _cut(
        self, seq_len: int | None, max_piece_len: int | None, max_pieces: int
    ) -> tuple[np.ndarray, ShardPieces, np.ndarray, int]:
        """The next global batch's buffers as cursors into the current shard's pieces."""
        seq_len = self.seq_len if seq_len is None else seq_len
        if seq_len < 1:
            raise ValueError(f"the step's sequence length must be >= 1, got {seq_len}")
        if max_piece_len is not None and max_piece_len != self._cap:
            if max_piece_len < 1:
                raise ValueError(f"the step's piece cap must be >= 1, got {max_piece_len}")
            self._cap, self._pieces = max_piece_len, None
        row_len = seq_len + 1
        # Every shard once from its start, and the current one again from its start.
        for _ in range(len(self.files) + 1):
            tokens, pieces = self._open()
            cursors = pieces.cursors(self._k, self.batch_size, row_len)
            if cursors is not None:
                break
            self._advance_shard()
        else:
            raise self._no_batch(seq_len)
        if max_pieces and (most := int(np.diff(cursors).max())) > max_pieces:
            raise ValueError(
                f"a packed sequence of this step ({seq_len} tokens + 1) needs {most} document "
                f"pieces, more than this stage's train.stages.rows.N.max_pieces allows "
                f"({max_pieces}; the record's cu_seqlens would overflow): raise it (nothing is "
                "truncated)"
            )
        self._k = int(cursors[-1])
        self.passes.served(self.batch_size * seq_len)
        return tokens, pieces, cursors, row_len

    def state_dict(self) -> dict[str, int]:
        """The global position: the same on every rank, independent of the world size."""
        return {
            "shard": self._shard,
            "bos_index": self._k,
            "epoch": self.epoch,
            **self.passes.state(),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue exactly where `state_dict()` was taken (on any world size)."""
        if "bos_index" not in state:
            raise ValueError(
                f"loader state {state} was not saved with data.align=pieces (no bos_index)"
            )
        shard, k, epoch = int(state["shard"]), int(state["bos_index"]), int(state["epoch"])
        if not 0 <= shard < len(self.files) or k < 0 or epoch < 0:
            raise ValueError(
                f"loader state {state} does not fit the {len(self.files)} training shards "
                "(were the shards changed since the checkpoint?)"
            )
        tokens = load_shard(self.files[shard])
        pieces = ShardPieces.index(tokens, self._cap)
        if k > len(pieces):
            raise ValueError(
                f"loader state {state}: {self.files[shard]} has only {len(pieces)} document "
                "starts (were the shards changed since the checkpoint?)"
            )
        check_token_ids(self.files[shard], tokens, GPT2_VOCAB_SIZE)
        self._shard, self._k, self.epoch = shard, k, epoch
        self.passes.load(state)
        self._tokens, self._pieces = tokens, pieces
