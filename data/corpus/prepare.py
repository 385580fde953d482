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
a fraction f of the documents (evenly spread) as a validation stream of its own. A corpus of
at most one shard is split in two instead: its first tenth of tokens (at least one sequence of
`--seq-len` + 1) is the validation shard, the rest the training shard.

Both splits must hold at least one sequence of `--seq-len` + 1 tokens (the trainer's
train.seq_len, 256 by default). When one cannot, or the input is bad, prepare fails and leaves
no output behind (for a corpus of at most one shard per split, before writing anything). The
printed train command sets train.val_tokens (and train.batch_size) to what the shards hold.

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
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tqdm import tqdm

from data.corpus.hub import quiet_hub_logging
from data.corpus.read import PrepareError, load_documents, tokenized
from data.corpus.shard_writer import Spec, Stream, Writer, load_manifest, manifest_path
from data.corpus.split import is_val

log = logging.getLogger(__name__)

# The trainer's defaults the printed command is sized against: train.seq_len and
# train.batch_size (trainer/config.py TrainConfig), data.val_tokens of conf/data/local.yaml.
TRAIN_SEQ_LEN = 256
TRAIN_BATCH_SIZE = 8
LOCAL_VAL_TOKENS = 1_048_576


def prepare(
    spec: Spec,
    out: str | Path,
    name: str = "corpus",
    num_proc: int = 1,
    streaming: bool = False,
    cache_dir: str | None = None,
    progress: bool = True,
    seq_len: int = TRAIN_SEQ_LEN,
) -> dict[str, Any]:
    """Write the shards of `spec` into `out` (resuming an interrupted run); return a summary.

    `seq_len` is the train.seq_len the shards are for: each split must hold one such sequence
    plus its target. On a PrepareError every file and directory this call made is removed
    again; an interruption (or an I/O error) keeps the finished shards for a resume.
    """
    if spec.shard_tokens < 1:
        raise PrepareError(f"--shard-tokens must be >= 1, got {spec.shard_tokens}")
    if spec.val_fraction is not None and not 0 < spec.val_fraction < 1:
        raise PrepareError(f"--val-fraction must be in (0, 1), got {spec.val_fraction}")
    if spec.bad_utf8 not in ("fail", "skip"):
        raise PrepareError(f"--bad-utf8 must be fail or skip, got {spec.bad_utf8!r}")
    if num_proc < 1:
        raise PrepareError(f"--num-proc must be >= 1, got {num_proc}")
    if seq_len < 1:
        raise PrepareError(f"--seq-len must be >= 1, got {seq_len}")
    if spec.shard_tokens < seq_len + 1:
        raise PrepareError(
            f"--shard-tokens {spec.shard_tokens} is less than one training sequence of "
            f"--seq-len {seq_len} plus its target ({seq_len + 1}); raise --shard-tokens"
        )
    out = Path(out).expanduser()
    made = [d for d in (out, *out.parents) if not d.exists()]  # innermost first
    before = set(out.iterdir()) if out.is_dir() else set()
    try:
        if cache_dir is None and spec.files:
            # datasets keeps an Arrow copy of local files in its cache (~ their size, under
            # ~/.cache/huggingface by default), useless once the shards exist: a temporary
            # cache beside the output, gone afterwards.
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=f".{out.name}-cache-", dir=out.parent) as tmp:
                return _prepare(spec, out, name, num_proc, streaming, tmp, progress, seq_len)
        return _prepare(spec, out, name, num_proc, streaming, cache_dir, progress, seq_len)
    except PrepareError:
        # Such an error comes back on every retry (the input or the settings are wrong), so
        # shards kept for a resume would only block a corrected command.
        for p in set(out.iterdir()) - before if out.is_dir() else ():
            p.unlink()
        for d in made:
            if d.exists() and not any(d.iterdir()):
                d.rmdir()
        raise


def _prepare(
    spec: Spec, out: Path, name: str, num_proc: int, streaming: bool, cache_dir: str | None,
    progress: bool, seq_len: int,
) -> dict[str, Any]:  # fmt: skip
    streams, complete = load_manifest(out, name, spec)
    if complete:
        log.info("%s is already prepared (%s)", out, manifest_path(out, name).name)
        return _summary(out, streams, docs=None, skipped=[], not_text=0, seconds=0.0)
    ds, skipped = load_documents(spec, cache_dir, streaming)

    def save(done: bool = False) -> None:
        manifest = {
            "spec": asdict(spec),
            "streams": [{"kind": s.kind, "shards": [asdict(x) for x in s.shards]} for s in streams],
            "complete": done,
        }
        tmp = manifest_path(out, name).with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=1))
        os.replace(tmp, manifest_path(out, name))

    writers = {s.kind: Writer(s, out, name, spec.shard_tokens, save) for s in streams}
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
    _check_splits(writers, spec, seq_len)
    for w in writers.values():
        w.finish()
    save(done=True)
    return _summary(out, streams, docs, skipped, not_text, time.perf_counter() - t0)


def _check_splits(writers: dict[str, Writer], spec: Spec, seq_len: int) -> None:
    """Fail unless validation and training each get one sequence of seq_len + 1 tokens; split
    a corpus of at most one shard in first-shard mode. Runs before the last shards are written
    (for a corpus of at most one shard per stream: before any is)."""
    need = seq_len + 1
    if "all" in writers:
        w = writers["all"]
        if not w.stream.shards:  # the whole corpus is in memory: give a tenth to validation
            if w.count < 2 * need:
                raise PrepareError(
                    f"the input holds {w.count} tokens: too little text for a validation and a "
                    f"training split of one --seq-len {seq_len} sequence + 1 ({need} tokens) "
                    "each; add text (or lower --seq-len, for a shorter train.seq_len)"
                )
            w.write(max(w.count // 10, need))
        elif w.count < need and len(w.stream.shards) == 1:
            raise PrepareError(
                f"the first shard ({spec.shard_tokens} tokens) is the validation set, leaving "
                f"{w.count} tokens, too little text for one training sequence of --seq-len "
                f"{seq_len} + 1: raise --shard-tokens, or use --val-fraction"
            )
        return
    val, train = writers["val"].tokens(), writers["train"]
    if val < need:
        raise PrepareError(
            f"--val-fraction {spec.val_fraction} holds out {val} tokens, fewer than one "
            f"validation sequence of --seq-len {seq_len} + 1 ({need}): raise --val-fraction"
        )
    if max([sh.tokens for sh in train.stream.shards] + [train.count]) < need:
        raise PrepareError(
            f"--val-fraction {spec.val_fraction} leaves {train.tokens()} training tokens, "
            f"too little text for one training sequence of --seq-len {seq_len} + 1 ({need}): "
            "lower --val-fraction"
        )


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
        # the training loader needs one batch (+ 1 token) inside a single shard
        "largest_train_shard": max((sh.tokens for sh in shards if "_train_" in sh.file), default=0),
        "documents_this_run": docs,
        "skipped_files_not_utf8": skipped,
        "skipped_documents_not_text": not_text,
        "seconds": seconds,
    }


def train_command(summary: dict[str, Any], seq_len: int = TRAIN_SEQ_LEN) -> str:
    """`python train.py ...` for these shards, with the overrides their size needs: a
    validation budget they hold (val_tokens // seq_len sequences + 1 token) and, for a small
    training split, a batch one shard holds (batch_size x seq_len + 1 tokens)."""
    args = ["python train.py data=local", f"data.dir={summary['out']}"]
    if seq_len != TRAIN_SEQ_LEN:
        args.append(f"train.seq_len={seq_len}")
    val_tokens = (summary["val_tokens"] - 1) // seq_len * seq_len
    if val_tokens < LOCAL_VAL_TOKENS:
        args.append(f"train.val_tokens={val_tokens}")
    batch = (summary["largest_train_shard"] - 1) // seq_len
    if batch < TRAIN_BATCH_SIZE:
        args.append(f"train.batch_size={batch}")
    return " ".join(args)


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
    p.add_argument(
        "--seq-len",
        type=int,
        default=TRAIN_SEQ_LEN,
        help=f"the train.seq_len to train with ({TRAIN_SEQ_LEN}): each split must hold one "
        "such sequence, and the printed train command is sized for it",
    )
    p.add_argument(
        "--cache-dir",
        default=None,
        help="datasets cache (default: Hugging Face's for --dataset; for --files a temporary "
        "one beside --out, removed afterwards)",
    )
    args = p.parse_args(argv)  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    quiet_hub_logging()
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
        summary = prepare(
            spec, args.out, args.name, args.num_proc, args.streaming, args.cache_dir,
            seq_len=args.seq_len,
        )  # fmt: skip
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
    batch = TRAIN_BATCH_SIZE * args.seq_len + 1
    if summary["largest_train_shard"] < batch:
        log.warning(
            "the largest training shard holds %d tokens, less than one default batch "
            "(train.batch_size=%d x train.seq_len=%d + 1 = %d), so the command below trains on "
            "smaller batches; more text (with a --shard-tokens above %d) allows the default",
            summary["largest_train_shard"], TRAIN_BATCH_SIZE, args.seq_len, batch, batch,
        )  # fmt: skip
    log.info("train on them: %s", train_command(summary, args.seq_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
