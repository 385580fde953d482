"""Token loaders: batches are the expected slices of the shards, on any number of ranks."""

import itertools
import re

import numpy as np
import pytest
import torch

from data.loader import (
    TokenLoader,
    val_batches,
    val_sequence_count,
)
from data.token_shards import ShardError, write_shard


def _shards(tmp_path, lengths):
    """Shards whose tokens are unique: shard i holds 1000 * i + 0, 1, 2, ..."""
    paths, arrays = [], []
    for i, n in enumerate(lengths):
        tokens = 1000 * i + np.arange(n)
        path = tmp_path / f"shard_{i:06d}.bin"
        write_shard(path, tokens)
        paths.append(path)
        arrays.append(tokens)
    return paths, arrays


def _expected(tokens, start, rows, seq_len):
    buf = tokens[start : start + rows * seq_len + 1]
    return buf[:-1].reshape(rows, seq_len), buf[1:].reshape(rows, seq_len)


def _cat(batches):
    xs, ys = zip(*batches, strict=True)
    return torch.cat(xs), torch.cat(ys)


# ---- TokenLoader ---------------------------------------------------------------------------


def test_batches_are_consecutive_slices_of_the_shard(tmp_path):
    files, (tokens,) = _shards(tmp_path, [1000])
    loader = TokenLoader(files, batch_size=4, seq_len=8)
    for step in range(5):
        x, y = loader.next_batch()
        assert x.dtype == y.dtype == torch.int64
        assert x.shape == y.shape == (4, 8)
        ex, ey = _expected(tokens, step * 32, 4, 8)
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)
        # Targets are the inputs shifted by one, across row boundaries too.
        assert torch.equal(x.flatten()[1:], y.flatten()[:-1])


def test_crossing_shards_skipping_short_ones_and_wrapping(tmp_path):
    # A batch of 2 x 4 needs 9 tokens: shard 0 fits two exactly (17), shard 1 is too short and
    # is skipped, shard 2 leaves 8 tokens after one batch, one short of another.
    files, arrays = _shards(tmp_path, [17, 5, 16])
    loader = TokenLoader(files, batch_size=2, seq_len=4)
    expected = [(0, 0, 0), (0, 8, 0), (2, 0, 0), (0, 0, 1), (0, 8, 1), (2, 0, 1), (0, 0, 2)]
    for shard, start, epoch in expected:
        x, y = loader.next_batch()
        ex, ey = _expected(arrays[shard], start, 2, 4)
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)
        assert loader.epoch == epoch


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_split_the_global_batch(tmp_path, world_size):
    files, _ = _shards(tmp_path, [300, 200])
    single = TokenLoader(files, batch_size=4, seq_len=8)
    ranks = [TokenLoader(files, 4, 8, rank=r, world_size=world_size) for r in range(world_size)]
    for _ in range(12):
        x, y = single.next_batch()
        rx, ry = _cat(loader.next_batch() for loader in ranks)
        assert rx.shape == (4, 8)
        assert torch.equal(rx, x) and torch.equal(ry, y)
    assert all(loader.state_dict() == single.state_dict() for loader in ranks)


def test_resume_continues_the_uninterrupted_stream(tmp_path):
    files, _ = _shards(tmp_path, [70, 50, 40])
    uninterrupted = TokenLoader(files, batch_size=3, seq_len=5)
    reference = [uninterrupted.next_batch() for _ in range(20)]

    first = TokenLoader(files, batch_size=3, seq_len=5)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    assert state == {"shard": 1, "pos": 15, "epoch": 0, "pass_tokens": 75}
    resumed = TokenLoader(files, batch_size=3, seq_len=5)
    resumed.next_batch()  # a loader already reading shard 0 must switch to the saved shard
    resumed.load_state_dict(dict(state))
    for x_ref, y_ref in reference[5:]:
        x, y = resumed.next_batch()
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert resumed.epoch > 0  # the resumed stream wrapped around at least once


def test_resume_on_another_world_size(tmp_path):
    files, _ = _shards(tmp_path, [200])
    one = TokenLoader(files, batch_size=4, seq_len=6)
    for _ in range(3):
        one.next_batch()
    two = [TokenLoader(files, 4, 6, rank=r, world_size=2) for r in range(2)]
    for loader in two:
        loader.load_state_dict(one.state_dict())
    for _ in range(10):
        x, y = one.next_batch()
        rx, ry = _cat(loader.next_batch() for loader in two)
        assert torch.equal(rx, x) and torch.equal(ry, y)


def test_batch_not_divisible_by_world_size(tmp_path):
    files, _ = _shards(tmp_path, [100])
    with pytest.raises(ValueError, match=r"train\.batch_size=6.*world size 4"):
        TokenLoader(files, batch_size=6, seq_len=4, rank=0, world_size=4)


def test_shards_too_small_for_one_batch(tmp_path):
    files, _ = _shards(tmp_path, [16, 10])
    with pytest.raises(ValueError, match=r"train\.batch_size=2.*train\.seq_len=8") as info:
        TokenLoader(files, batch_size=2, seq_len=8)
    assert str(files[0]) in str(info.value)
    x, _ = TokenLoader(files, batch_size=3, seq_len=5).next_batch()  # 16 tokens: one fits
    assert x.shape == (3, 5)


def test_a_batch_the_sample_corpus_cannot_hold_names_the_toy(tmp_path):
    """data=sample is small: a full-size batch on it says what to do, its numbers kept."""
    from data.build import build_data
    from data.config import DataConfig
    from data.corpus.sample import corpus_dir

    cache = corpus_dir(tmp_path, DataConfig().val_fraction)  # a built sample-corpus cache
    cache.mkdir(parents=True)
    write_shard(cache / "train_000000.bin", np.arange(50))
    write_shard(cache / "val_000000.bin", np.arange(100))
    with pytest.raises(ValueError, match=r"train\.batch_size=4 x train\.seq_len=16 needs 65 "
                       r"tokens, the largest of .* has 50; data=sample is a small corpus: a "
                       r"record preset runs on it at toy size .*data=fineweb10b"):  # fmt: skip
        build_data(DataConfig(cache_dir=str(tmp_path)), batch_size=4, seq_len=16,
                   val_tokens=64, seed=0)  # fmt: skip


def test_no_files():
    with pytest.raises(ValueError, match="no training shards"):
        TokenLoader([], batch_size=2, seq_len=8)


def test_corrupt_shard_is_reported_up_front(tmp_path):
    files, _ = _shards(tmp_path, [100, 100])
    files[1].write_bytes(files[1].read_bytes()[:-2])
    with pytest.raises(ShardError, match=re.escape(str(files[1]))):
        TokenLoader(files, batch_size=2, seq_len=4)


def test_bad_loader_state(tmp_path):
    files, _ = _shards(tmp_path, [100])
    loader = TokenLoader(files, batch_size=2, seq_len=4)
    with pytest.raises(ValueError, match="shards"):
        loader.load_state_dict({"shard": 1, "pos": 0, "epoch": 0})
    with pytest.raises(ValueError, match="shards"):
        loader.load_state_dict({"shard": 0, "pos": 101, "epoch": 0})


# ---- val_batches -------------------------------------------------------------------------


def _row_set(batches):
    """The (x, y) rows of some batches, sorted: the set, whatever order the ranks made it in."""
    x, y = _cat(batches)
    return sorted(zip(map(tuple, x.tolist()), map(tuple, y.tolist()), strict=True))


def test_val_set_is_the_first_val_tokens(tmp_path):
    files, (tokens,) = _shards(tmp_path, [100])
    x, y = _cat(val_batches(files, val_tokens=50, batch_size=4, seq_len=8))
    # 50 tokens round down to 6 whole sequences.
    ex, ey = _expected(tokens, 0, 6, 8)
    np.testing.assert_array_equal(x.numpy(), ex)
    np.testing.assert_array_equal(y.numpy(), ey)
    assert val_sequence_count(files, 50, 8) == 6


def test_val_batch_sizes(tmp_path):
    files, _ = _shards(tmp_path, [100])
    sizes = [len(x) for x, _ in val_batches(files, val_tokens=56, batch_size=3, seq_len=8)]
    assert sizes == [3, 3, 1]


@pytest.mark.parametrize("batch_size", [1, 2, 5, 7, 100])
def test_val_set_does_not_depend_on_batch_size(tmp_path, batch_size):
    files, _ = _shards(tmp_path, [100])
    x1, y1 = _cat(val_batches(files, 56, batch_size=1, seq_len=8))
    x, y = _cat(val_batches(files, 56, batch_size=batch_size, seq_len=8))
    assert torch.equal(x, x1) and torch.equal(y, y1)


@pytest.mark.parametrize(("batch_size", "world_size"), [(3, 2), (4, 2), (5, 3), (2, 4)])
def test_val_ranks_partition_the_set(tmp_path, batch_size, world_size):
    files, _ = _shards(tmp_path, [100])
    x1, y1 = _cat(val_batches(files, 56, batch_size, seq_len=8))
    per_rank = [
        list(val_batches(files, 56, batch_size, 8, rank=r, world_size=world_size))
        for r in range(world_size)
    ]
    assert _row_set(b for batches in per_rank for b in batches) == _row_set([(x1, y1)])
    assert all(len(bx) > 0 for batches in per_rank for bx, _ in batches)


def test_val_sequences_span_shards(tmp_path):
    files, arrays = _shards(tmp_path, [20, 20])
    stream = np.concatenate(arrays)
    x, y = _cat(val_batches(files, val_tokens=32, batch_size=8, seq_len=8))
    ex, ey = _expected(stream, 0, 4, 8)
    np.testing.assert_array_equal(x.numpy(), ex)
    np.testing.assert_array_equal(y.numpy(), ey)


def test_val_tokens_exceeding_the_data(tmp_path):
    files, _ = _shards(tmp_path, [100])
    # 96 tokens need 97 with the last target; 100 are there. 104 would need 105.
    val_sequence_count(files, 96, 8)
    with pytest.raises(ValueError, match=r"train\.val_tokens=104 needs 105.*only 100") as info:
        val_batches(files, val_tokens=104, batch_size=4, seq_len=8)  # raises before iterating
    assert str(files[0]) in str(info.value)


def test_val_data_shorter_than_one_sequence(tmp_path):
    files, _ = _shards(tmp_path, [8])
    with pytest.raises(ValueError, match=r"train\.seq_len=8") as info:
        val_batches(files, val_tokens=8, batch_size=1, seq_len=8)
    assert str(files[0]) in str(info.value)


def test_val_tokens_less_than_one_sequence(tmp_path):
    files, _ = _shards(tmp_path, [100])
    with pytest.raises(ValueError, match=r"train\.val_tokens=7.*train\.seq_len=8"):
        val_batches(files, val_tokens=7, batch_size=1, seq_len=8)


# ---- document-aligned (BOS) batches --------------------------------------------------------

EOT = 50256


def _documents(tmp_path, n_docs=60, seed=0):
    """One shard of documents of random lengths 5..60, each opened by EOT; ids are unique-ish."""
    rng = np.random.default_rng(seed)
    docs = [
        np.concatenate([[EOT], rng.integers(0, 50000, rng.integers(5, 60))]) for _ in range(n_docs)
    ]
    tokens = np.concatenate(docs)
    path = tmp_path / "docs_000000.bin"
    write_shard(path, tokens)
    return path, tokens


def _reference_bos_rows(tokens, n_rows, seq_len):
    """Greedy: each row starts at the first EOT at or after where the last row's inputs end."""
    bos = np.flatnonzero(tokens == EOT)
    rows, pos = [], 0
    for _ in range(n_rows):
        start = bos[np.searchsorted(bos, pos)]
        rows.append(tokens[start : start + seq_len + 1])
        pos = start + seq_len
    return np.stack(rows)


def test_bos_rows_start_at_documents_and_never_overlap(tmp_path):
    path, tokens = _documents(tmp_path)
    loader = TokenLoader([path], batch_size=4, seq_len=16, align="bos")
    batches = [loader.next_batch() for _ in range(5)]
    want = _reference_bos_rows(tokens, 20, 16)
    x = torch.cat([b[0] for b in batches]).numpy()
    y = torch.cat([b[1] for b in batches]).numpy()
    assert (x[:, 0] == EOT).all()
    np.testing.assert_array_equal(x, want[:, :-1])
    np.testing.assert_array_equal(y, want[:, 1:])
    # No leakage between batches: each row's inputs lie wholly after the previous row's.
    starts = [
        int(np.flatnonzero((np.lib.stride_tricks.sliding_window_view(tokens, 17) == r).all(1))[0])
        for r in want
    ]
    assert all(b >= a + 16 for a, b in itertools.pairwise(starts))


def test_bos_ranks_split_the_global_batch_and_resume(tmp_path):
    path, _ = _documents(tmp_path)
    one = TokenLoader([path], batch_size=4, seq_len=16, align="bos")
    ranks = [TokenLoader([path], 4, 16, rank=r, world_size=2, align="bos") for r in (0, 1)]
    for _ in range(3):
        x1, _ = one.next_batch()
        x2 = torch.cat([r.next_batch()[0] for r in ranks])
        assert torch.equal(x1, x2)
    state = one.state_dict()
    assert ranks[0].state_dict() == ranks[1].state_dict() == state
    resumed = TokenLoader([path], batch_size=4, seq_len=16, align="bos")
    resumed.load_state_dict(state)
    assert torch.equal(resumed.next_batch()[0], one.next_batch()[0])


def test_bos_without_room_for_a_batch_names_the_switch(tmp_path):
    path = tmp_path / "docs_000000.bin"
    write_shard(path, np.tile(np.concatenate([[EOT], np.arange(49)]), 6))  # 6 documents
    loader = TokenLoader([path], batch_size=8, seq_len=32, align="bos")  # stream mode fits
    with pytest.raises(ValueError, match=r"8 document-aligned rows.*data\.align=bos"):
        loader.next_batch()


def test_token_ids_beyond_the_vocabulary_name_the_shard(tmp_path):
    path = tmp_path / "bad_000000.bin"
    write_shard(path, [1, 2, 50300, 4] * 100)
    with pytest.raises(ShardError, match=r"bad_000000\.bin: token id 50300 .*position 2"):
        TokenLoader([path], batch_size=2, seq_len=8)
    with pytest.raises(ShardError, match="token id 50300"):
        val_batches([path], val_tokens=64, batch_size=2, seq_len=8)


def test_shard_directory_errors_name_the_key(tmp_path):
    from data.build import find_shards
    from data.config import DataConfig

    with pytest.raises(FileNotFoundError, match=r"data\.dir="):
        find_shards(DataConfig(source="shards", dir=str(tmp_path / "nope")))
    write_shard(tmp_path / "x_train_000001.bin", np.arange(100))
    with pytest.raises(FileNotFoundError, match=r"no validation shards .* data\.val_files"):
        find_shards(DataConfig(source="shards", dir=str(tmp_path)))
    with pytest.raises(ValueError, match="both match"):
        find_shards(DataConfig(source="shards", dir=str(tmp_path), val_files="*.bin"))
    write_shard(tmp_path / "x_val_000000.bin", np.arange(100))
    files = find_shards(DataConfig(source="shards", dir=str(tmp_path)))
    assert [f.name for f in files.train] == ["x_train_000001.bin"]
    assert [f.name for f in files.val] == ["x_val_000000.bin"]


# ---- a length per step -------------------------------------------------------------------


def test_stream_takes_the_steps_length(tmp_path):
    files, (tokens,) = _shards(tmp_path, [200])
    loader = TokenLoader(files, batch_size=2, seq_len=8)
    start = 0
    for seq_len in (8, 4, 12, 8):
        x, y = loader.next_batch(seq_len)
        ex, ey = _expected(tokens, start, 2, seq_len)
        np.testing.assert_array_equal(x.numpy(), ex)
        np.testing.assert_array_equal(y.numpy(), ey)
        start += 2 * seq_len
    with pytest.raises(ValueError, match=r"train\.batch_size=2 x 100 tokens"):
        loader.next_batch(100)  # no shard holds it: fails, never loops


def test_bos_rejects_another_length(tmp_path):
    path, _ = _documents(tmp_path)
    loader = TokenLoader([path], batch_size=2, seq_len=16, align="bos")
    loader.next_batch(16)
    with pytest.raises(ValueError, match=r"train\.seq_len=16 only.*asked for 32"):
        loader.next_batch(32)
    with pytest.raises(ValueError, match="TokenLoader cuts"):
        TokenLoader([path], batch_size=2, seq_len=16, align="pieces")
