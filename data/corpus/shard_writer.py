"""The shard streams `data.corpus.prepare` writes, and the manifest that makes a run resumable.

`<name>_prepare.json` records the settings (`Spec`) and, after each shard, where in the document
stream the next one starts, so the same command after an interruption resumes after the last
finished shard and writes the same bytes an uninterrupted run would.
"""

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from data.corpus.read import PrepareError
from data.token_shards import ShardError, read_header, write_shard

FORMAT = 1  # of the manifest and the output; bump when tokenization or cutting changes


@dataclass(frozen=True)
class Spec:
    """Everything the output depends on (recorded in the manifest; a resume must match it)."""

    files: tuple[str, ...] = ()
    dataset: str = ""
    config: str | None = None
    split: str = "train"
    text_field: str = "text"
    shard_tokens: int = 100_000_000
    val_fraction: float | None = None  # None: the first shard is the validation set
    bad_utf8: str = "fail"  # fail | skip (leave such files out)
    format: int = FORMAT


@dataclass
class Shard:
    file: str
    tokens: int
    next_doc: int  # where the following shard of this stream starts: document index...
    next_offset: int  # ...and token offset inside it


@dataclass
class Stream:
    """One output stream (train, val, or both in first-shard mode) and its finished shards."""

    kind: str  # "val", "train" or "all"
    shards: list[Shard] = field(default_factory=list)

    def resume_point(self) -> tuple[int, int]:
        return (self.shards[-1].next_doc, self.shards[-1].next_offset) if self.shards else (0, 0)

    def shard_name(self, name: str, index: int) -> str:
        # FineWeb's numbering: val from 000000, train from 000001.
        if self.kind == "val" or (self.kind == "all" and index == 0):
            return f"{name}_val_{index:06d}.bin"
        return f"{name}_train_{index + (self.kind == 'train'):06d}.bin"


class Writer:
    """Cuts one stream's tokens into shards and records each in the manifest as it lands.

    A shard is written only once the stream runs past it, so a stream of at most one shard is
    still all in memory at the end, where `prepare` checks it (and may split it) first.
    """

    def __init__(
        self, stream: Stream, out: Path, name: str, shard_tokens: int, save: Callable[[], None]
    ) -> None:
        self.stream, self.out, self.name, self.size = stream, out, name, shard_tokens
        self.save = save
        self.resume = stream.resume_point()
        self.parts: list[tuple[int, int, np.ndarray]] = []  # (document, offset in it, tokens)
        self.count = 0

    def tokens(self) -> int:
        """All of this stream's tokens so far: written and buffered."""
        return sum(sh.tokens for sh in self.stream.shards) + self.count

    def feed(self, doc: int, tokens: np.ndarray) -> None:
        if doc < self.resume[0]:
            return  # before this stream's resume point: already in a finished shard
        offset = self.resume[1] if doc == self.resume[0] else 0
        if offset < len(tokens):
            self.parts.append((doc, offset, tokens[offset:]))
            self.count += len(tokens) - offset
        while self.count > self.size:
            self.write(self.size)

    def write(self, n: int) -> None:
        """Write the first `n` buffered tokens as the next shard."""
        taken, kept, at, next_at = [], [], 0, (0, 0)
        for doc, offset, tokens in self.parts:
            if at == n:
                kept.append((doc, offset, tokens))
                continue
            k = min(len(tokens), n - at)
            taken.append(tokens[:k])
            at += k
            next_at = (doc, offset + k)
            if k < len(tokens):
                kept.append((doc, offset + k, tokens[k:]))
        self.parts, self.count = kept, self.count - n
        self._write(np.concatenate(taken) if taken else np.zeros(0, np.uint16), *next_at)

    def finish(self) -> None:
        if self.count:
            data = np.concatenate([t for _, _, t in self.parts])
            self.parts, self.count = [], 0
            self._write(data, sys.maxsize, 0)

    def _write(self, data: np.ndarray, next_doc: int, next_offset: int) -> None:
        file = self.stream.shard_name(self.name, len(self.stream.shards))
        self.out.mkdir(parents=True, exist_ok=True)
        write_shard(self.out / file, data)
        self.stream.shards.append(Shard(file, len(data), next_doc, next_offset))
        self.save()


def manifest_path(out: Path, name: str) -> Path:
    return out / f"{name}_prepare.json"


def load_manifest(out: Path, name: str, spec: Spec) -> tuple[list[Stream], bool]:
    """Finished streams from an earlier run with the same spec (empty when none)."""
    kinds = ["val", "train"] if spec.val_fraction is not None else ["all"]
    fresh = [Stream(k) for k in kinds]
    path = manifest_path(out, name)
    if not path.exists():
        return fresh, False
    try:
        saved = json.loads(path.read_text())
        old = Spec(**{**saved["spec"], "files": tuple(saved["spec"]["files"])})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PrepareError(f"{path} is unreadable ({e}); delete it or use another --out") from e
    if old != spec:
        differ = [k for k in asdict(spec) if asdict(spec)[k] != asdict(old)[k]]
        raise PrepareError(
            f"{out} holds shards prepared with other settings ({', '.join(differ)} differ); "
            "use another --out, or delete that directory to start over"
        )
    streams = []
    for s in saved["streams"]:
        stream = Stream(s["kind"])
        for sh in s["shards"]:
            shard = Shard(**sh)
            try:
                intact = read_header(out / shard.file) == shard.tokens
            except ShardError:
                intact = False
            if not intact:
                break  # redo this shard and everything after it
            stream.shards.append(shard)
        streams.append(stream)
    return streams, bool(saved.get("complete")) and all(
        len(a.shards) == len(b["shards"]) for a, b in zip(streams, saved["streams"], strict=True)
    )
