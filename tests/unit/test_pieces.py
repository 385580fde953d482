"""Packed document pieces (data/pieces.py, data.align=pieces): record_2025_11_29's training batches.

Checked against a hand-worked example and against a literal transcription of record_2025_11_29's
loop (docs/records.md, C.5) written here, on every world size, across shard ends, with a length per
step, resumed.
"""

import numpy as np
import pytest
import torch

from data.build import build_data
from data.config import DataConfig
from data.loader import val_batches
from data.pieces import PieceLoader, ShardPieces
from data.token_shards import write_shard
from model.masks import document_ids

B = 50256  # the BOS (<|endoftext|>)


def _write(tmp_path, shards):
    paths = []
    for i, tokens in enumerate(shards):
        path = tmp_path / f"train_{i:06d}.bin"
        write_shard(path, np.asarray(tokens))
        paths.append(path)
    return paths


# ---- a hand-worked example -----------------------------------------------------------------

# Shard 0: a stray token, then documents A (3 tokens), C (1), D (6 > max 4), E (4), F (3),
# G (2), H (3, ends at the shard end).
SHARD_0 = [7, B, 10, 11, B, B, 20, 21, 22, 23, 24, B, 30, 31, 32, B, 40, 41, B, 50, B, 60, 61]
SHARD_1 = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]  # no document start at all
# Shard 2: I (7 > max 4), J (2), K (4), M (2).
SHARD_2 = [B, 70, 71, 72, 73, 74, 75, B, 80, B, 90, 91, 92, B, 95]

# (L, buffers of L + 1 tokens, state after the step), with 2 buffers a step and pieces <= 4.
HAND_WORKED = [
    (
        6,
        # A whole, the 1-token document C, then D cut to fill the buffer (22, 23, 24 dropped).
        # Next buffer: E whole, F whole, filling it exactly.
        [[B, 10, 11, B, B, 20, 21], [B, 30, 31, 32, B, 40, 41]],
        {"shard": 0, "bos_index": 5, "epoch": 0, "pass_tokens": 12},
    ),
    (
        # G + H fill a 5-token buffer, but shard 0 has nothing left for the second one: the
        # batch is dropped, shard 1 has no documents, and shard 2 serves from its first BOS.
        # I keeps its first 4 tokens (73, 74, 75 never read); J's BOS then ends the buffer.
        4,
        [[B, 70, 71, 72, B], [B, 90, 91, 92, B]],
        {"shard": 2, "bos_index": 4, "epoch": 0, "pass_tokens": 20},
    ),
    (
        # Shard 2 is used up: wrap to shard 0's first BOS, a new epoch.
        4,
        [[B, 10, 11, B, B], [B, 30, 31, 32, B]],
        {"shard": 0, "bos_index": 5, "epoch": 1, "pass_tokens": 8},
    ),
]


@pytest.mark.parametrize("world_size", [1, 2])
def test_hand_worked_buffers(tmp_path, world_size):
    files = _write(tmp_path, [SHARD_0, SHARD_1, SHARD_2])
    loaders = [PieceLoader(files, 2, 6, 4, r, world_size) for r in range(world_size)]
    for seq_len, buffers, state in HAND_WORKED:
        got = [loader.next_batch(seq_len) for loader in loaders]
        x = torch.cat([g[0] for g in got])
        y = torch.cat([g[1] for g in got])
        want = torch.tensor(buffers)
        assert x.dtype == y.dtype == torch.int64
        assert torch.equal(x, want[:, :-1]) and torch.equal(y, want[:, 1:])
        assert all(loader.state_dict() == state for loader in loaders)


def test_hand_worked_pieces_and_segments(tmp_path):
    # The pieces of shard 0 and the cursors of step 1, and that the model's document rule
    # (a segment starts at every BOS) splits the inputs exactly at those pieces.
    pieces = ShardPieces.index(np.asarray(SHARD_0), max_piece_len=4)
    assert pieces.starts.tolist() == [1, 4, 5, 11, 15, 18, 20]
    assert pieces.lengths.tolist() == [3, 1, 4, 4, 3, 2, 3]
    cursors = pieces.cursors(0, rows=2, row_len=7)
    assert cursors.tolist() == [0, 3, 5]
    starts, lengths = pieces.row_pieces(0, 3, row_len=7)
    assert starts.tolist() == [1, 4, 5] and lengths.tolist() == [3, 1, 3]  # D cut to 3
    assert pieces.cursors(5, rows=2, row_len=5) is None  # G + H fill one buffer, not two

    files = _write(tmp_path, [SHARD_0])
    x, _ = PieceLoader(files, 2, 6, 4).next_batch()
    assert _segments([3, 1, 3], 6) == [0, 0, 0, 1, 2, 2] == (document_ids(x[0]) - 1).tolist()


def _segments(lengths, seq_len):
    """Segment id of each input position from the pieces' lengths (docs/records.md,
    record_2025_11_29 (C.5): boundaries 0, the cumulative lengths, the last piece one token shorter
    so the last boundary is L)."""
    bounds = np.cumsum([0, *lengths])
    bounds[-1] -= 1
    assert bounds[-1] == seq_len
    return [int(np.searchsorted(bounds, p, side="right")) - 1 for p in range(seq_len)]


# ---- against a transcription of C.5 ---------------------------------------------------------


def _reference(shards, batch_size, max_piece, lengths):
    """C.5's loop as written: yields (buffers, (shard, k, epoch)) per step."""
    shard, k, epoch = 0, 0, 0
    for seq_len in lengths:
        while True:
            tokens = np.asarray(shards[shard])
            bos = [p for p, t in enumerate(tokens) if t == B]
            buffers, kk, ok = [], k, True
            for _ in range(batch_size):
                buf = []
                while len(buf) < seq_len + 1:
                    if kk >= len(bos):
                        ok = False
                        break
                    c = bos[kk]
                    nxt = bos[kk + 1] if kk + 1 < len(bos) else len(tokens)
                    e = min(nxt, c + max_piece, c + (seq_len + 1 - len(buf)))
                    buf.extend(tokens[c:e].tolist())
                    kk += 1
                if not ok:
                    break
                buffers.append(buf)
            if ok:
                k = kk
                yield np.array(buffers), (shard, k, epoch)
                break
            shard, k = shard + 1, 0
            if shard == len(shards):
                shard, epoch = 0, epoch + 1


def _random_shards(seed, n_shards=3, n_docs=40, max_doc=30):
    """Shards of documents of 1..max_doc tokens (1 = a BOS followed by a BOS), each opened
    by its BOS, after a few stray tokens; ids count up so that every token is distinct."""
    rng = np.random.default_rng(seed)
    shards, next_id = [], 0
    for _ in range(n_shards):
        tokens = list(range(next_id, next_id + 3))
        for _ in range(n_docs):
            n = int(rng.integers(1, max_doc + 1))
            tokens += [B, *range(next_id + 3, next_id + 2 + n)]
            next_id += n + 2
        shards.append(tokens)
        next_id += 3
    return shards


LENGTHS = [8, 16, 8, 24, 16, 24, 8, 16, 24, 24, 16, 8, 24, 24, 16]  # crosses shard ends, wraps


def test_matches_the_reference_on_every_world_size(tmp_path):
    shards = _random_shards(0)
    files = _write(tmp_path, shards)
    reference = list(_reference(shards, 8, 12, LENGTHS))
    assert reference[-1][1][2] >= 1  # the run wraps around: a shard end is crossed
    assert len({state[0] for _, state in reference}) == 3
    for world_size in (1, 2, 4, 8):
        ranks = [PieceLoader(files, 8, 8, 12, r, world_size) for r in range(world_size)]
        for seq_len, (buffers, (shard, k, epoch)) in zip(LENGTHS, reference, strict=True):
            got = [loader.next_batch(seq_len) for loader in ranks]
            assert all(g[0].shape == (8 // world_size, seq_len) for g in got)
            x, y = torch.cat([g[0] for g in got]), torch.cat([g[1] for g in got])
            assert torch.equal(x, torch.from_numpy(buffers[:, :-1]))
            assert torch.equal(y, torch.from_numpy(buffers[:, 1:]))
            state = {"shard": shard, "bos_index": k, "epoch": epoch}
            assert all(loader.state_dict().items() >= state.items() for loader in ranks)


def test_segments_from_pieces_are_the_document_rule(tmp_path):
    shards = _random_shards(1, n_shards=1, n_docs=60)
    pieces = ShardPieces.index(np.asarray(shards[0]), max_piece_len=12)
    loader = PieceLoader(_write(tmp_path, shards), 4, 16, 12)
    k, seen_cut, seen_one = 0, False, False
    for _ in range(3):
        x, _ = loader.next_batch()
        cursors = pieces.cursors(k, rows=4, row_len=17)
        for row, first, stop in zip(x, cursors[:-1], cursors[1:], strict=True):
            _, lengths = pieces.row_pieces(int(first), int(stop), 17)
            seen_cut |= bool(lengths[-1] < pieces.lengths[stop - 1])
            seen_one |= bool((lengths[:-1] == 1).any())
            assert _segments(lengths.tolist(), 16) == (document_ids(row) - 1).tolist()
        k = int(cursors[-1])
    assert seen_cut and seen_one  # the cases that matter did occur


def test_resume_continues_bitwise_on_any_world_size(tmp_path):
    shards = _random_shards(2)
    files = _write(tmp_path, shards)
    uninterrupted = PieceLoader(files, 8, 8, 12)
    reference = [uninterrupted.next_batch(n) for n in LENGTHS]
    first = PieceLoader(files, 8, 8, 12)
    for n in LENGTHS[:6]:
        first.next_batch(n)
    state = first.state_dict()
    for world_size in (1, 4):
        ranks = [PieceLoader(files, 8, 8, 12, r, world_size) for r in range(world_size)]
        for loader in ranks:
            loader.next_batch(24)  # a loader already under way must take the saved position
            loader.load_state_dict(dict(state))
        for n, (x_ref, y_ref) in zip(LENGTHS[6:], reference[6:], strict=True):
            got = [loader.next_batch(n) for loader in ranks]
            assert torch.equal(torch.cat([g[0] for g in got]), x_ref)
            assert torch.equal(torch.cat([g[1] for g in got]), y_ref)
    assert uninterrupted.epoch >= 1


# ---- errors -----------------------------------------------------------------------------


def test_no_shard_holds_a_batch_names_the_keys(tmp_path):
    # 20 tokens each; with pieces of at most 2 tokens, 10 of them usable in each shard.
    files = _write(tmp_path, [[B, 1, 2, 3] * 5, [B, 4] * 5 + [9] * 10])
    with pytest.raises(ValueError, match=r"train\.batch_size=2 .*data\.max_piece_len=2"):
        PieceLoader(files, batch_size=2, seq_len=5, max_piece_len=2)  # 12 needed
    with pytest.raises(ValueError, match=r"train\.batch_size=4 .*train\.seq_len=5.*need 24"):
        PieceLoader(files, batch_size=4, seq_len=5, max_piece_len=4)  # headers alone say no
    loader = PieceLoader(files, batch_size=2, seq_len=5, max_piece_len=4)  # 6 + 6 of 20: fits
    loader.next_batch()
    with pytest.raises(ValueError, match=r"2 buffers of 10 tokens.*data\.align=pieces"):
        loader.next_batch(9)  # a longer step no shard can serve fails, never loops


def test_shards_without_documents(tmp_path):
    files = _write(tmp_path, [np.arange(40), np.arange(30)])
    with pytest.raises(ValueError, match=r"no training shard holds a document start"):
        PieceLoader(files, batch_size=2, seq_len=4, max_piece_len=8)


def test_bad_arguments_and_state(tmp_path):
    files = _write(tmp_path, [SHARD_0])
    with pytest.raises(ValueError, match=r"data\.max_piece_len must be >= 1"):
        PieceLoader(files, 2, 6, 0)
    with pytest.raises(ValueError, match=r"train\.batch_size=3.*world size 2"):
        PieceLoader(files, 3, 2, 4, rank=0, world_size=2)
    loader = PieceLoader(files, 2, 6, 4)
    with pytest.raises(ValueError, match="length must be >= 1"):
        loader.next_batch(0)
    with pytest.raises(ValueError, match=r"data\.align=pieces"):
        loader.load_state_dict({"shard": 0, "pos": 0, "epoch": 0})  # a TokenLoader's state
    with pytest.raises(ValueError, match="has only 7 document starts"):
        loader.load_state_dict({"shard": 0, "bos_index": 8, "epoch": 0})
    with pytest.raises(ValueError, match="1 training shards"):
        loader.load_state_dict({"shard": 1, "bos_index": 0, "epoch": 0})
    assert loader.state_dict() == {"shard": 0, "bos_index": 0, "epoch": 0, "pass_tokens": 0}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"align": "pieces"}, r"data\.max_piece_len must be >= 1"),
        ({"align": "pieces", "max_piece_len": -1}, r"data\.max_piece_len must be >= 1"),
        ({"align": "stream", "max_piece_len": 2048}, r"data\.max_piece_len=2048 only applies"),
        ({"align": "pieces", "max_piece_len": 8, "source": "synthetic"}, r"data\.align=pieces"),
    ],
)
def test_config_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataConfig(**kwargs).validate()
    DataConfig(align="pieces", max_piece_len=2048).validate()
    DataConfig().validate()


def test_build_data_makes_a_piece_loader(tmp_path):
    _write(tmp_path, [SHARD_0])
    write_shard(tmp_path / "x_val_000000.bin", np.arange(100))
    cfg = DataConfig(source="shards", dir=str(tmp_path), train_files="train_*.bin",
                     val_files="x_val_*.bin", align="pieces", max_piece_len=4)  # fmt: skip
    loader, val = build_data(
        cfg, batch_size=2, seq_len=6, val_tokens=64, seed=0, rank=1, world_size=2
    )
    assert isinstance(loader, PieceLoader) and loader.max_piece_len == 4
    x, _ = loader.next_batch()
    assert x.tolist() == [[B, 30, 31, 32, B, 40]]  # rank 1's buffer of the hand-worked step 1
    # Validation is the unaligned stream, as for every align: here rank 1's 5 of 10 sequences.
    want = list(val_batches([tmp_path / "x_val_000000.bin"], 64, 2, 6, rank=1, world_size=2))
    got = list(val())
    gx, wx = torch.cat([b[0] for b in got]), torch.cat([b[0] for b in want])
    gy, wy = torch.cat([b[1] for b in got]), torch.cat([b[1] for b in want])
    assert len(gx) == 5 and torch.equal(gx, wx) and torch.equal(gy, wy)


def test_a_full_size_batch_on_the_sample_corpus_names_the_toy_and_the_real_corpus(tmp_path):
    """A record preset at full size on data=sample (#89: 8 buffers of 49,153 tokens): the
    error keeps its numbers and keys and says what to do; on shards of one's own it does not."""
    from data.corpus.sample import corpus_dir

    cache = corpus_dir(tmp_path, DataConfig().val_fraction)  # a built sample-corpus cache
    cache.mkdir(parents=True)
    write_shard(cache / "train_000000.bin", np.array([B, *range(1, 10)] * 10))  # 100 tokens
    write_shard(cache / "val_000000.bin", np.arange(100))
    # The header fits 2 x 31 tokens, but pieces of at most 4 tokens leave 40 of them.
    sample = DataConfig(cache_dir=str(tmp_path), align="pieces", max_piece_len=4)
    numbers = r"train\.batch_size=2 buffers of 31 tokens .*data\.max_piece_len=4 .*\.bin'\]; "
    with pytest.raises(ValueError, match=numbers) as e:
        build_data(sample, batch_size=2, seq_len=30, val_tokens=64, seed=0)
    hint = e.value.args[0].split("]; ", 1)[1]
    assert hint.startswith("data=sample is a small corpus: a record preset runs on it at toy size")
    for part in ("train.batch_size", "train.seq_len", "train.stages.rows.N.seq_len",
                 "README's 'First hour'", "data=fineweb10b (docs/data.md)"):  # fmt: skip
        assert part in hint
    own = DataConfig(source="shards", dir=str(cache), train_files="train_*.bin",
                     val_files="val_*.bin", align="pieces", max_piece_len=4)  # fmt: skip
    with pytest.raises(ValueError, match=r"data\.align=pieces\): \[.*\.bin'\]$"):
        build_data(own, batch_size=2, seq_len=30, val_tokens=64, seed=0)


def test_stage_lengths_with_a_loader_of_one_length_are_refused_before_work() -> None:
    from tests.helpers import compose_config
    from trainer.config import to_config

    with pytest.raises(ValueError, match=r"train\.stages\.rows\.N\.seq_len .* data\.align=bos"):
        to_config(compose_config(["data.align=bos", "train.seq_len=256", "run_dir=.",
                                  "train.stages.rows=[{seq_len:128},{seq_len:256}]"]))  # fmt: skip
