"""Benchmark the data path: loader tokens/s from memory-mapped shards, and corpus preparation.

Loader: a 100M-token shard of FineWeb-like documents (random ids, an <|endoftext|> every ~1000
tokens) is written to a temporary directory, and `TokenLoader.next_batch` is timed for the
record-class global batch (512 x 1024 tokens) on 1 rank and as rank 0 of 8, in both
`data.align` modes. Tokens/s counts the tokens each call hands to its rank.

Prepare: the embedded Wikipedia sample, repeated to --repeat copies, is written as a .jsonl
file; the baseline is a single-process loop of `encode_ordinary` over the same documents
(text already in memory), against `python -m data.corpus.prepare`'s `prepare()` end to end (read
with `datasets`, tokenize with --num-proc processes, write shards), in the same run.

    python scripts/bench/data_pipeline.py                   # ~2 minutes on a 2-core CPU
    python scripts/bench/data_pipeline.py --num-proc 8 --repeat 16
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from data.corpus import prepare as prep
from data.corpus.sample import sample_dump_path
from data.corpus.wikitext import clean_wikitext, iter_articles
from data.loader import TokenLoader
from data.token_shards import write_shard
from data.tokenizer import EOT, gpt2_encoding


def bench_loader(tmp: Path, calls: int) -> list[tuple[str, float]]:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, EOT, 100_000_000, dtype=np.uint16)
    tokens[::1000] = EOT  # a document start every 1000 tokens
    path = tmp / "bench_train_000001.bin"
    write_shard(path, tokens)
    rows = []
    for align in ("stream", "bos"):
        for world in (1, 8):
            loader = TokenLoader([path], 512, 1024, rank=0, world_size=world, align=align)
            loader.next_batch()  # opens the shard (header, token-id check, BOS index)
            times = []
            for _ in range(calls):
                t0 = time.perf_counter()
                x, _ = loader.next_batch()
                times.append(time.perf_counter() - t0)
            rate = x.numel() / statistics.median(times)
            rows.append((f"{align}, rank 0 of {world} ({x.shape[0]} x 1024 per call)", rate))
    return rows


def bench_prepare(tmp: Path, repeat: int, num_proc: int) -> dict:
    docs = [clean_wikitext(text) for _, text in iter_articles(sample_dump_path())] * repeat
    src = tmp / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    enc = gpt2_encoding()
    t0 = time.perf_counter()
    n_loop = sum(len(enc.encode_ordinary(d)) + 1 for d in docs)
    loop_s = time.perf_counter() - t0
    spec = prep.Spec(files=(str(src),), shard_tokens=10_000_000)
    cache = str(tmp / "hf-cache")
    prep.prepare(spec, tmp / "warm", num_proc=1, cache_dir=cache, progress=False)  # arrow cache
    rates = {}
    for n in (1, num_proc):
        t0 = time.perf_counter()
        out = prep.prepare(spec, tmp / f"out{n}", num_proc=n, cache_dir=cache, progress=False)
        rates[n] = n_loop / (time.perf_counter() - t0)
        assert out["tokens"] == n_loop, "prepare and the loop disagree on the token count"
    return {"docs": len(docs), "tokens": n_loop, "loop": n_loop / loop_s, "prep": rates}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20, help="loader calls timed (median)")
    parser.add_argument("--repeat", type=int, default=8, help="copies of the sample corpus")
    parser.add_argument("--num-proc", type=int, default=2, help="prepare's processes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        rows = bench_loader(tmp, args.calls)
        p = bench_prepare(tmp, args.repeat, args.num_proc)
    print("| loader (memory-mapped shard) | tokens/s |\n|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate / 1e6:,.0f} M |")
    print(f"\nprepare, {p['docs']} documents, {p['tokens'] / 1e6:.1f}M tokens:\n")
    print("| | tokens/s | ratio |\n|---|---|---|")
    print(f"| single-process encode_ordinary loop (text in memory) | {p['loop'] / 1e6:.2f} M | 1 |")
    for n, rate in p["prep"].items():
        print(
            f"| prepare(), num_proc={n}, read + tokenize + write | "
            f"{rate / 1e6:.2f} M | **{rate / p['loop']:.2f}×** |"
        )


if __name__ == "__main__":
    main()
