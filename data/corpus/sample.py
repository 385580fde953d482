"""The embedded sample corpus: a slice of English Wikipedia that gensim ships as test data.

It makes the default run work offline anywhere: the articles are cleaned to plain prose,
tokenized with GPT-2 (each document prefixed with EOT), split into train/val by document and
written once as shards into a cache directory. Text: Wikipedia, CC BY-SA.
"""

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
from tqdm import tqdm

from data.corpus.split import is_val
from data.corpus.wikitext import iter_articles
from data.token_shards import CorpusFiles, ShardError, read_header, write_shard
from data.tokenizer import encode_document

SAMPLE_DUMP = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
# Bump when cleaning, tokenization or splitting changes, so stale caches are never reused.
CORPUS_VERSION = 1


def sample_dump_path() -> Path:
    """The Wikipedia dump inside the installed gensim package.

    find_spec locates it without importing gensim (importing gensim.test.utils takes seconds).
    """
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the sample corpus is read from gensim's test data: pip install gensim")
    path = Path(next(iter(spec.submodule_search_locations))) / "test" / "test_data" / SAMPLE_DUMP
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; the installed gensim lacks its test data "
            "(reinstall: pip install --force-reinstall gensim)"
        )
    return path


def corpus_dir(cache_dir: str | os.PathLike, val_fraction: float) -> Path:
    """Cache directory keyed by version and split, so a changed setting never reuses shards."""
    return Path(cache_dir).expanduser() / f"sample-v{CORPUS_VERSION}-val{val_fraction:g}"


def _is_built(files: CorpusFiles) -> bool:
    try:
        return all(read_header(path) > 0 for path in files.train + files.val)
    except ShardError:
        return False


def _tokenize(dump: Path, val_fraction: float, progress: bool) -> tuple[np.ndarray, np.ndarray]:
    """(train, val) token streams of the dump's articles."""
    splits: dict[bool, list[np.ndarray]] = {False: [], True: []}
    articles = tqdm(
        iter_articles(dump),
        desc="building sample corpus",
        unit=" articles",
        disable=None if progress else True,  # None: shown only on a terminal
    )
    for index, (title, text) in enumerate(articles):
        tokens = np.array(encode_document(f"{title}\n\n{text}"), dtype=np.uint16)
        splits[is_val(index, val_fraction)].append(tokens)
    if not splits[False] or not splits[True]:
        raise ValueError(
            f"data.val_fraction={val_fraction} leaves the train or the val split of the "
            f"{len(splits[False]) + len(splits[True])} sample documents empty"
        )
    return np.concatenate(splits[False]), np.concatenate(splits[True])


def build_sample_corpus(
    cache_dir: str | os.PathLike, val_fraction: float = 0.1, progress: bool = True
) -> CorpusFiles:
    """Train/val shards of the sample corpus, built on first use and cached.

    The build goes to a temporary directory renamed into place when complete, so an interrupted
    build leaves no half-written cache; a cache whose shards fail validation is rebuilt.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
    final = corpus_dir(cache_dir, val_fraction)
    files = CorpusFiles(train=[final / "train_000000.bin"], val=[final / "val_000000.bin"])
    if _is_built(files):
        return files

    dump = sample_dump_path()
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)  # left by a killed process that had our pid
    tmp.mkdir(parents=True)
    try:
        train, val = _tokenize(dump, val_fraction, progress)
        write_shard(tmp / files.train[0].name, train)
        write_shard(tmp / files.val[0].name, val)
        if final.exists() and not _is_built(files):
            shutil.rmtree(final)  # a corrupt cache
        try:
            os.rename(tmp, final)
        except OSError:
            # Another process (e.g. another rank) finished the same build first: use its.
            if not _is_built(files):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return files
