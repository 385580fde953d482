"""Turn any corpus into GPT-2 token shards: `python -m data.corpus.prepare`.

    python -m data.corpus.prepare --files notes/*.txt --out shards/notes
    python -m data.corpus.prepare --files a.jsonl b.jsonl --text-field body --out shards/ab
    python -m data.corpus.prepare --dataset HuggingFaceFW/fineweb-edu --config sample-10BT \\
        --streaming --out shards/edu --num-proc 16
    python train.py data=local data.dir=shards/notes

Documents come from local `.txt` (one document per file), `.jsonl` or `.parquet` files, or
from any dataset `datasets.load_dataset` can load (a hub name or a local directory). Each
document is tokenized with GPT-2 (`encode_ordinary`, prefixed with <|endoftext|>) in
`--num-proc` processes, in order, and the token stream is cut into shards of `--shard-tokens`
in the FineWeb shard format: `<name>_val_000000.bin`, then `<name>_train_000001.bin`, ...
By default the first shard is the validation set; `--val-fraction f` instead holds out about
a fraction f of the documents (evenly spread) as a validation stream of its own.

The output depends only on the input and the settings (not on `--num-proc`), byte for byte.
`<name>_prepare.json` records the settings and, after each shard, where in the document
stream the next one starts; a run that is interrupted keeps its finished shards, and the same
command again resumes after the last of them.
"""

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from data.corpus.read import PrepareError, load_documents, tokenized
from data.corpus.split import is_val
from data.shards import ShardError, read_header, write_shard

log = logging.getLogger(__name__)

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


class _Writer:
    """Cuts one stream's tokens into shards and records each in the manifest as it lands."""

    def __init__(
        self, stream: Stream, out: Path, name: str, shard_tokens: int, save: Callable[[], None]
    ) -> None:
        self.stream, self.out, self.name, self.size = stream, out, name, shard_tokens
        self.save = save
        self.resume = stream.resume_point()
        self.parts: list[np.ndarray] = []
        self.count = 0

    def feed(self, doc: int, tokens: np.ndarray) -> None:
        if (doc, 0) < (self.resume[0], 0):
            return  # before this stream's resume point: already in a finished shard
        offset = self.resume[1] if doc == self.resume[0] else 0
        tokens = tokens[offset:]
        while self.count + len(tokens) >= self.size:
            cut = self.size - self.count
            self.parts.append(tokens[:cut])
            offset += cut
            self._write(doc, offset)
            tokens = tokens[cut:]
        if len(tokens):
            self.parts.append(tokens)
            self.count += len(tokens)

    def finish(self) -> None:
        if self.count:
            self._write(sys.maxsize, 0)

    def _write(self, next_doc: int, next_offset: int) -> None:
        data = np.concatenate(self.parts) if self.parts else np.zeros(0, np.uint16)
        file = self.stream.shard_name(self.name, len(self.stream.shards))
        write_shard(self.out / file, data)
        self.stream.shards.append(Shard(file, len(data), next_doc, next_offset))
        self.save()
        self.parts, self.count = [], 0


def _manifest_path(out: Path, name: str) -> Path:
    return out / f"{name}_prepare.json"


def _load_manifest(out: Path, name: str, spec: Spec) -> tuple[list[Stream], bool]:
    """Finished streams from an earlier run with the same spec (empty when none)."""
    kinds = ["val", "train"] if spec.val_fraction is not None else ["all"]
    fresh = [Stream(k) for k in kinds]
    path = _manifest_path(out, name)
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


def prepare(
    spec: Spec,
    out: str | Path,
    name: str = "corpus",
    num_proc: int = 1,
    streaming: bool = False,
    cache_dir: str | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Write the shards of `spec` into `out` (resuming an interrupted run); return a summary."""
    if spec.shard_tokens < 1:
        raise PrepareError(f"--shard-tokens must be >= 1, got {spec.shard_tokens}")
    if spec.val_fraction is not None and not 0 < spec.val_fraction < 1:
        raise PrepareError(f"--val-fraction must be in (0, 1), got {spec.val_fraction}")
    if spec.bad_utf8 not in ("fail", "skip"):
        raise PrepareError(f"--bad-utf8 must be fail or skip, got {spec.bad_utf8!r}")
    if num_proc < 1:
        raise PrepareError(f"--num-proc must be >= 1, got {num_proc}")
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    streams, complete = _load_manifest(out, name, spec)
    if complete:
        log.info("%s is already prepared (%s)", out, _manifest_path(out, name).name)
        return _summary(out, streams, docs=None, skipped=[], not_text=0, seconds=0.0)
    ds, skipped = load_documents(spec, cache_dir, streaming)

    def save(done: bool = False) -> None:
        manifest = {
            "spec": asdict(spec),
            "streams": [{"kind": s.kind, "shards": [asdict(x) for x in s.shards]} for s in streams],
            "complete": done,
        }
        tmp = _manifest_path(out, name).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, _manifest_path(out, name))

    writers = {s.kind: _Writer(s, out, name, spec.shard_tokens, save) for s in streams}
    start = min(w.resume[0] for w in writers.values())
    total = None if streaming else len(ds)
    t0, docs, not_text = time.perf_counter(), 0, 0
    bar = tqdm(total=total, initial=start, desc="documents", unit="doc", disable=not progress)
    for doc, tokens in enumerate(tokenized(ds, spec.text_field, start, num_proc), start):
        bar.update()
        docs += 1
        if tokens is None:
            not_text += 1
            continue
        if spec.val_fraction is None:
            writers["all"].feed(doc, tokens)
        else:
            writers["val" if is_val(doc, spec.val_fraction) else "train"].feed(doc, tokens)
    bar.close()
    for w in writers.values():
        w.finish()
    names = [sh.file for s in streams for sh in s.shards]
    if not any("_train_" in n for n in names) or not any("_val_" in n for n in names):
        raise PrepareError(
            f"the input made {len(names)} shard(s) ({', '.join(names) or 'none'}): too little "
            "text for a validation and a training shard; lower --shard-tokens or use "
            "--val-fraction"
        )
    save(done=True)
    return _summary(out, streams, docs, skipped, not_text, time.perf_counter() - t0)


def _summary(
    out: Path, streams: list[Stream], docs: int | None, skipped: list[str], not_text: int,
    seconds: float,
) -> dict[str, Any]:  # fmt: skip
    shards = [sh for s in streams for sh in s.shards]
    return {
        "out": str(out),
        "shards": [sh.file for sh in shards],
        "tokens": sum(sh.tokens for sh in shards),
        "val_tokens": sum(sh.tokens for sh in shards if "_val_" in sh.file),
        "documents_this_run": docs,
        "skipped_files_not_utf8": skipped,
        "skipped_documents_not_text": not_text,
        "seconds": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    src = p.add_argument_group("input (one of)")
    src.add_argument("--files", nargs="+", default=[], help=".txt, .jsonl or .parquet files")
    src.add_argument("--dataset", default="", help="a dataset load_dataset accepts")
    p.add_argument("--config", default=None, help="the dataset's config name")
    p.add_argument("--split", default="train", help="the dataset's split (train)")
    p.add_argument("--streaming", action="store_true", help="stream the dataset, no full copy")
    p.add_argument("--text-field", default="text", help="the column holding the text (text)")
    p.add_argument("--out", required=True, help="directory for the shards")
    p.add_argument("--name", default="corpus", help="shard file prefix (corpus)")
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard")
    p.add_argument(
        "--val-fraction",
        type=float,
        default=None,
        help="hold out this fraction of documents (default: the first shard is val)",
    )
    p.add_argument("--num-proc", type=int, default=os.cpu_count() or 1, help="tokenizer processes")
    p.add_argument(
        "--bad-utf8",
        choices=["fail", "skip"],
        default="fail",
        help="a .txt/.jsonl file that is not UTF-8: fail (default) or leave it out",
    )
    p.add_argument("--cache-dir", default=None, help="datasets cache (default: HF's)")
    args = p.parse_args(argv)  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = Spec(
        files=tuple(args.files),
        dataset=args.dataset,
        config=args.config,
        split=args.split,
        text_field=args.text_field,
        shard_tokens=args.shard_tokens,
        val_fraction=args.val_fraction,
        bad_utf8=args.bad_utf8,
    )
    try:
        summary = prepare(spec, args.out, args.name, args.num_proc, args.streaming, args.cache_dir)
    except PrepareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for bad in summary["skipped_files_not_utf8"]:
        log.warning("left out, not UTF-8: %s", bad)
    log.info(
        "%d tokens (%d validation) in %d shards under %s; %d files left out (not UTF-8), "
        "%d documents left out (text not a string)",
        summary["tokens"],
        summary["val_tokens"],
        len(summary["shards"]),
        summary["out"],
        len(summary["skipped_files_not_utf8"]),
        summary["skipped_documents_not_text"],
    )
    log.info("train on them: python train.py data=local data.dir=%s", summary["out"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
