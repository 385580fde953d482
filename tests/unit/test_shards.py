"""The shard format: byte layout, round trips, and a clear error for every kind of bad file."""

import os
import re
import struct

import numpy as np
import pytest

from data import token_shards
from data.token_shards import MAGIC, VERSION, ShardError, load_shard, read_header, write_shard


def _raw_shard(path, header_ints, tokens=(), extra=b""):
    """Write a shard by hand (not via write_shard), so bad files can be made on purpose."""
    header = list(header_ints) + [0] * (256 - len(header_ints))
    path.write_bytes(
        struct.pack("<256i", *header) + struct.pack(f"<{len(tokens)}H", *tokens) + extra
    )
    return path


@pytest.mark.parametrize("n", [0, 1, 7, 300_001])
def test_round_trip(tmp_path, n):
    tokens = np.random.default_rng(n).integers(0, 65536, size=n)
    path = tmp_path / "s.bin"
    write_shard(path, tokens)
    assert read_header(path) == n
    loaded = load_shard(path)
    assert loaded.dtype == np.uint16
    assert not loaded.flags.writeable
    np.testing.assert_array_equal(loaded, tokens)


def test_round_trip_from_list_and_memmap(tmp_path):
    write_shard(tmp_path / "a.bin", [0, 50256, 65535])
    assert isinstance(load_shard(tmp_path / "a.bin"), np.memmap)
    write_shard(tmp_path / "b.bin", load_shard(tmp_path / "a.bin"))
    assert load_shard(tmp_path / "b.bin").tolist() == [0, 50256, 65535]


def test_header_layout_is_the_fineweb_format(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 258])
    raw = path.read_bytes()
    assert len(raw) == 256 * 4 + 3 * 2
    header = struct.unpack("<256i", raw[:1024])
    assert header[:3] == (20240520, 1, 3)
    assert all(v == 0 for v in header[3:])
    assert struct.unpack("<3H", raw[1024:]) == (1, 2, 258)
    # Little-endian on disk whatever the machine: 258 = 0x0102 is stored as bytes 02 01.
    assert raw[-2:] == b"\x02\x01"


def test_reads_a_hand_written_shard(tmp_path):
    path = _raw_shard(tmp_path / "s.bin", [MAGIC, VERSION, 4], [5, 6, 7, 8])
    assert load_shard(path).tolist() == [5, 6, 7, 8]


@pytest.mark.parametrize(
    ("header", "tokens", "extra", "message"),
    [
        ([1234, VERSION, 2], [1, 2], b"", "bad magic"),
        ([MAGIC, 2, 2], [1, 2], b"", "version"),
        ([MAGIC, VERSION, 5], [1, 2], b"", "truncated"),
        ([MAGIC, VERSION, 2], [1, 2], b"\x00", "odd length"),
        ([MAGIC, VERSION, 2], [1, 2, 3], b"", "trailing bytes"),
        ([MAGIC, VERSION, -1], [], b"", "negative"),
    ],
)
def test_bad_shards_raise_naming_the_file(tmp_path, header, tokens, extra, message):
    path = _raw_shard(tmp_path / "bad.bin", header, tokens, extra)
    for read in (read_header, load_shard):
        with pytest.raises(ShardError, match=message) as info:
            read(path)
        assert str(path) in str(info.value)


def test_file_shorter_than_header(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(struct.pack("<3i", MAGIC, VERSION, 0))
    with pytest.raises(ShardError, match=re.escape(str(path)) + ".*shorter than"):
        read_header(path)


def test_missing_file(tmp_path):
    with pytest.raises(ShardError, match=re.escape(str(tmp_path / "nope.bin"))):
        read_header(tmp_path / "nope.bin")


@pytest.mark.parametrize("tokens", [[1, 65536], [-1, 3], np.array([0.5]), np.zeros((2, 2), int)])
def test_write_refuses_tokens_that_do_not_fit(tmp_path, tokens):
    path = tmp_path / "s.bin"
    with pytest.raises(ShardError, match=re.escape(str(path))):
        write_shard(path, tokens)
    assert os.listdir(tmp_path) == []


def test_failed_write_leaves_nothing_behind(tmp_path, monkeypatch):
    path = tmp_path / "s.bin"

    def fail(fd):
        raise OSError("disk full")

    # fsync runs after the bytes are written and before the rename: a crash mid-write.
    monkeypatch.setattr(token_shards.os, "fsync", fail)
    with pytest.raises(OSError, match="disk full"):
        write_shard(path, np.arange(1000))
    assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_old_shard(tmp_path, monkeypatch):
    path = tmp_path / "s.bin"
    write_shard(path, [1, 2, 3])

    def fail(src, dst):
        raise OSError("interrupted")

    monkeypatch.setattr(token_shards.os, "replace", fail)
    with pytest.raises(OSError, match="interrupted"):
        write_shard(path, np.arange(1000))
    assert os.listdir(tmp_path) == ["s.bin"]
    assert load_shard(path).tolist() == [1, 2, 3]
