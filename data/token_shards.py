"""Token shards in the format of the public FineWeb10B GPT-2 shards.

Layout: a header of 256 little-endian int32 (magic 20240520, version 1, token count, zeros),
then `count` little-endian uint16 tokens. Using the same format means the shards speedrunners
already download load as-is, and shards written here load in their tools.
"""

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4
TOKEN_BYTES = 2
_HEADER_DTYPE = np.dtype("<i4")
_TOKEN_DTYPE = np.dtype("<u2")


class ShardError(ValueError):
    """A shard file that is not a valid token shard; the message names the file."""


@dataclass(frozen=True)
class CorpusFiles:
    """The shard files of a corpus, each split in stream order."""

    train: list[Path]
    val: list[Path]


def write_shard(path: str | os.PathLike, tokens: npt.ArrayLike) -> None:
    """Write `tokens` as a shard at `path`, atomically.

    The bytes go to a temporary file in the same directory that is renamed into place only when
    complete, so an interrupted write never leaves a valid-looking shard behind.
    """
    path = Path(path)
    array = np.asarray(tokens)
    if array.ndim != 1:
        raise ShardError(f"{path}: tokens must be a 1-D sequence, got shape {array.shape}")
    if array.size and not np.issubdtype(array.dtype, np.integer):
        raise ShardError(f"{path}: tokens must be integers, got dtype {array.dtype}")
    if array.size and (array.min() < 0 or array.max() > np.iinfo(_TOKEN_DTYPE).max):
        raise ShardError(
            f"{path}: token ids must be in [0, 65535] to fit uint16, "
            f"got range [{array.min()}, {array.max()}]"
        )
    if array.size > np.iinfo(_HEADER_DTYPE).max:
        raise ShardError(f"{path}: {array.size} tokens do not fit one shard's int32 count")
    header = np.zeros(HEADER_INTS, dtype=_HEADER_DTYPE)
    header[:3] = (MAGIC, VERSION, array.size)

    # A unique hidden name next to the target: same filesystem, so the rename is atomic.
    # (Not mkstemp: its 0600 mode would make shared caches unreadable to other users.)
    tmp_path = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp_path, "xb") as f:
            f.write(header.tobytes())
            f.write(array.astype(_TOKEN_DTYPE, copy=False).tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def read_header(path: str | os.PathLike) -> int:
    """Validate the shard at `path` and return its token count.

    The file length must match the header exactly: a truncated download or a file that is not
    a shard fails here, by name, instead of as garbage tokens mid-run.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise ShardError(f"{path}: cannot read shard ({e.strerror})") from e
    if size < HEADER_BYTES:
        raise ShardError(
            f"{path}: file is {size} bytes, shorter than the {HEADER_BYTES}-byte shard header"
        )
    header = np.fromfile(path, dtype=_HEADER_DTYPE, count=HEADER_INTS)
    magic, version, count = (int(v) for v in header[:3])
    if magic != MAGIC:
        raise ShardError(f"{path}: bad magic number {magic}, expected {MAGIC}; not a token shard")
    if version != VERSION:
        raise ShardError(f"{path}: unsupported shard version {version}, expected {VERSION}")
    if count < 0:
        raise ShardError(f"{path}: header says {count} tokens, which is negative")
    payload = size - HEADER_BYTES
    if payload % TOKEN_BYTES:
        raise ShardError(f"{path}: token data is {payload} bytes, an odd length for uint16 tokens")
    expected = count * TOKEN_BYTES
    if payload < expected:
        raise ShardError(
            f"{path}: truncated file: header says {count} tokens "
            f"but only {payload // TOKEN_BYTES} are present"
        )
    if payload > expected:
        raise ShardError(
            f"{path}: trailing bytes: header says {count} tokens "
            f"but the file holds {payload // TOKEN_BYTES}"
        )
    return count


def load_shard(path: str | os.PathLike) -> np.ndarray:
    """The tokens of a validated shard as a read-only uint16 array, memory-mapped (not read)."""
    count = read_header(path)
    if count == 0:
        # mmap cannot map zero bytes; an empty read-only array is the same to callers.
        empty = np.zeros(0, dtype=_TOKEN_DTYPE)
        empty.flags.writeable = False
        return empty
    return np.memmap(path, dtype=_TOKEN_DTYPE, mode="r", offset=HEADER_BYTES, shape=(count,))


def check_token_ids(path: str | os.PathLike, tokens: np.ndarray, vocab_size: int) -> None:
    """Fail, naming the file and position, if any token id is outside [0, vocab_size).

    One pass over the tokens (~50 ms per 100M on a CPU): a bad id would otherwise index past
    the embedding, or silently train on a different vocabulary.
    """
    if tokens.size == 0:
        return
    top = int(tokens.max())
    if top >= vocab_size:
        where = int(np.argmax(tokens >= vocab_size))
        raise ShardError(
            f"{path}: token id {top} (first bad id at position {where}) is outside the "
            f"vocabulary of {vocab_size} tokens; the shard was written with another tokenizer"
        )
