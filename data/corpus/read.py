"""Reading a corpus for `data.corpus.prepare`: documents from files or a dataset, tokenized
in order by a pool of worker processes."""

import codecs
import json
import multiprocessing
import sys
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from data.tokenizer import EOT, gpt2_encoding

BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
_DOCS_PER_TASK = 64


class PrepareError(ValueError):
    """Bad input or settings; the message names the file, field or flag."""


class Source(Protocol):
    """Where the documents come from (`prepare.Spec` has these fields)."""

    files: tuple[str, ...]
    dataset: str
    config: str | None
    split: str
    text_field: str
    bad_utf8: str


def check_utf8(files: list[Path]) -> list[tuple[Path, str]]:
    """Each file that is not valid UTF-8, with where the first bad byte is."""
    bad = []
    for f in files:
        decoder, offset = codecs.getincrementaldecoder("utf-8")(), 0
        with open(f, "rb") as fh:
            while chunk := fh.read(1 << 24):
                try:
                    decoder.decode(chunk)
                except UnicodeDecodeError as e:
                    bad.append((f, f"byte {chunk[e.start]:#04x} at offset {offset + e.start}"))
                    break
                offset += len(chunk)
            else:
                try:
                    decoder.decode(b"", final=True)
                except UnicodeDecodeError:
                    bad.append((f, "a truncated UTF-8 sequence at the end"))
    return bad


def load_documents(spec: Source, cache_dir: str | None, streaming: bool) -> tuple[Any, list[str]]:
    """The dataset of documents and the files left out as non-UTF-8 (with --bad-utf8 skip)."""
    import datasets

    if bool(spec.files) == bool(spec.dataset):
        raise PrepareError("give either --files or --dataset")
    skipped: list[str] = []
    if spec.dataset:
        if not Path(spec.dataset).expanduser().exists():  # a hub name, not a local directory
            from data.corpus.hub import hub_unreachable

            why = hub_unreachable()
            if why:
                raise PrepareError(
                    f"--dataset {spec.dataset!r}: {why}. Check the network (or set HF_ENDPOINT "
                    "to a mirror); for a dataset already in the cache, set HF_HUB_OFFLINE=1"
                )
        try:
            ds = datasets.load_dataset(
                spec.dataset,
                spec.config,
                split=spec.split,
                streaming=streaming,
                cache_dir=cache_dir,
            )
        except Exception as e:  # datasets raises many types (network, not found, bad config)
            raise PrepareError(f"--dataset {spec.dataset!r}: {type(e).__name__}: {e}") from e
    else:
        files = [Path(f) for f in spec.files]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise PrepareError(f"--files: no such file(s): {', '.join(missing)}")
        kinds = {f.suffix.lower() for f in files}
        unknown = kinds - BUILDERS.keys()
        if unknown or len({BUILDERS[k] for k in kinds - unknown}) > 1:
            raise PrepareError(
                f"--files must all be one of {sorted(BUILDERS)} (.txt, .jsonl or .parquet), "
                f"got {sorted(kinds)}"
            )
        builder = BUILDERS[kinds.pop()]
        if builder in ("text", "json"):
            bad = check_utf8(files)
            skipped = [f"{f} ({why})" for f, why in bad]
            if bad and spec.bad_utf8 == "fail":
                raise PrepareError(
                    f"{len(bad)} file(s) are not UTF-8: {'; '.join(skipped)}. Fix them, or pass "
                    "--bad-utf8 skip to leave such files out (they are counted and listed)"
                )
            files = [f for f in files if f not in {f for f, _ in bad}]
            if not files:
                raise PrepareError("every input file was left out as not UTF-8")
        extra = {"sample_by": "document"} if builder == "text" else {}
        try:
            ds = datasets.load_dataset(
                builder,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=cache_dir,
                **extra,
            )
        except Exception as e:
            mixed = _mixed_columns(files, builder, spec.text_field)
            if mixed:
                raise PrepareError(mixed) from e
            named = ", ".join(map(str, files[:5])) + (
                f" (+{len(files) - 5} more)" * (len(files) > 5)
            )
            raise PrepareError(
                f"reading {builder} files failed ({named}): {type(e).__name__}: {e}"
                + (f" (cause: {e.__cause__})" if e.__cause__ else "")
            ) from e
    columns = ds.column_names
    if columns is not None and spec.text_field not in columns:
        raise PrepareError(
            f"--text-field {spec.text_field!r} is not a column of the input; it has {columns}"
        )
    if not streaming and len(ds) == 0:
        raise PrepareError("the input holds no documents")
    return ds, skipped


def _columns(path: Path, builder: str) -> tuple[str, ...] | None:
    """The columns of a .jsonl file's first records or a .parquet file's schema (None when they
    cannot be read): enough to tell which files differ, without reading whole files."""
    try:
        if builder == "parquet":
            import pyarrow.parquet as pq

            return tuple(sorted(pq.read_schema(path).names))
        keys: set[str] = set()
        with open(path, encoding="utf-8") as fh:
            for _, line in zip(range(100), fh, strict=False):
                if line.strip():
                    keys.update(json.loads(line))
        return tuple(sorted(keys))
    except (OSError, ValueError, TypeError):
        return None


def _mixed_columns(files: list[Path], builder: str, text_field: str) -> str | None:
    """Which input files have which columns, when they differ (datasets needs every file of
    one load to share its columns, and its error names no file)."""
    if builder == "text" or len(files) < 2:
        return None
    groups: dict[tuple[str, ...] | None, list[str]] = {}
    for f in files:
        groups.setdefault(_columns(f, builder), []).append(str(f))
    if len(groups) < 2:
        return None

    def listed(names: list[str]) -> str:
        return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    layouts = "; ".join(
        f"{listed(names)}: {list(cols) if cols is not None else 'unreadable'}"
        for cols, names in groups.items()
    )
    lacking = [
        n for cols, names in groups.items() if cols and text_field not in cols for n in names
    ]
    missing = f" (missing from {listed(lacking)})" if lacking else ""
    return (
        f"--files do not all have the same columns, which reading them together needs: "
        f"{layouts}. The text is read from the column --text-field {text_field!r}{missing}; "
        "prepare files of one layout together"
    )


def _encode_batch(texts: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """EOT + GPT-2 tokens of every text, concatenated as uint16, and each one's length (-1 for
    a value that is not a string). One array each way keeps what crosses processes small."""
    enc = gpt2_encoding()
    lengths = np.full(len(texts), -1, dtype=np.int64)
    encoded = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            # = encode_ordinary (no special tokens: a literal "<|endoftext|>" stays text), but
            # straight into an array, without a Python int per token.
            encoded.append(enc.encode_to_numpy(text, disallowed_special=()))
            lengths[i] = len(encoded[-1]) + 1
    flat = np.empty(int(lengths[lengths > 0].sum()), dtype=np.uint16)
    at = 0
    for ids in encoded:
        flat[at] = EOT
        flat[at + 1 : at + 1 + len(ids)] = ids
        at += len(ids) + 1
    return flat, lengths


def _split(encoded: tuple[np.ndarray, np.ndarray]) -> Iterator[np.ndarray | None]:
    flat, lengths = encoded
    at = 0
    for n in lengths.tolist():
        if n < 0:
            yield None
        else:
            yield flat[at : at + n]
            at += n


def _batches(ds: Any, text_field: str, start: int) -> Iterator[list[Any]]:
    it = ds.skip(start) if start else ds
    for batch in it.iter(batch_size=_DOCS_PER_TASK):
        if text_field not in batch:
            raise PrepareError(
                f"--text-field {text_field!r} is not a field of the input; it has {list(batch)}"
            )
        yield batch[text_field]


_worker: dict[str, Any] = {}  # in each tokenizer process: the dataset and its text column


def _init_worker(ds: Any, text_field: str) -> None:
    _worker.update(ds=ds, field=text_field)
    gpt2_encoding()  # build the tokenizer once per process, before the first task


def _encode_rows(lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Tokenize rows [lo, hi) read by this worker itself from the (memory-mapped) dataset."""
    return _encode_batch(_worker["ds"][lo:hi][_worker["field"]])


def tokenized(ds: Any, text_field: str, start: int, num_proc: int) -> Iterator[np.ndarray | None]:
    """Tokenized documents from index `start`, in order, using `num_proc` processes.

    A map-style dataset (local files, a downloaded hub dataset) is memory-mapped Arrow: each
    worker reads its own rows, so only row ranges and token arrays cross process boundaries.
    A streamed dataset can only be read here, so its texts are sent to the workers.
    """
    if num_proc == 1:
        for texts in _batches(ds, text_field, start):
            yield from _split(_encode_batch(texts))
        return
    import datasets

    if isinstance(ds, datasets.Dataset):
        n = len(ds)
        tasks: Iterator[tuple[Any, tuple]] = (
            (_encode_rows, (lo, min(lo + _DOCS_PER_TASK, n)))
            for lo in range(start, n, _DOCS_PER_TASK)
        )
    else:
        tasks = ((_encode_batch, (texts,)) for texts in _batches(ds, text_field, start))
    # A bounded queue of tasks, not Pool.imap over the whole input (imap would read ahead
    # without limit): workers stay busy while this process writes shards.
    pending: deque = deque()
    # fork on Linux: workers inherit the imported modules, the dataset and the built tokenizer
    # at no cost (spawned ones spend seconds importing datasets), as datasets.map does too.
    ctx = multiprocessing.get_context("fork" if sys.platform == "linux" else "spawn")
    with ctx.Pool(num_proc, _init_worker, (ds, text_field)) as pool:
        for fn, args in tasks:
            pending.append(pool.apply_async(fn, args))
            if len(pending) >= num_proc * 4:
                yield from _split(pending.popleft().get())
        while pending:
            yield from _split(pending.popleft().get())
