"""From the `data` config (data/config.py): this rank's train batches and fixed val batches."""

from collections.abc import Callable, Iterable
from pathlib import Path

from data.config import DataConfig
from data.loader import Batch, NoBatch, TokenLoader, val_batches
from data.pieces import PieceLoader
from data.synthetic import SyntheticLoader, synthetic_val_batches
from data.token_shards import CorpusFiles

# What to do when a batch does not fit the embedded corpus (data.source=sample).
SAMPLE_AT_FULL_SIZE = (
    "data=sample is a small corpus: a record preset runs on it at toy size (smaller "
    "train.batch_size, train.seq_len and train.stages.rows.N.seq_len, as in the toy commands of "
    "README's 'First hour'), or at full size on its real corpus, data=fineweb10b (docs/data.md)"
)


def find_shards(cfg: DataConfig) -> CorpusFiles:
    """The train and val shards under `data.dir`, in name order; fail naming what is missing,
    and, where the config states its FineWeb shard count, the command that fetches them."""
    root = Path(cfg.dir).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(
            f"data.dir={cfg.dir!r}: {root} is not a directory; {_how_to_fill(cfg)}, or try a "
            "preset offline on the embedded corpus at toy size (data=sample with the toy "
            "overrides of README's 'First hour': a full-size preset does not fit a CPU)"
        )
    train, val = sorted(root.glob(cfg.train_files)), sorted(root.glob(cfg.val_files))
    for kind, key, found in (("training", "train_files", train), ("validation", "val_files", val)):
        if not found:
            raise FileNotFoundError(
                f"no {kind} shards in {root} match data.{key}={getattr(cfg, key)!r}; "
                f"{_how_to_fill(cfg)}"
            )
    if cfg.fineweb_shards and any(p.name.startswith("fineweb_train_") for p in train):
        _check_fineweb(cfg, {p.name for p in train})
    overlap = set(train) & set(val)
    if overlap:
        raise ValueError(
            f"data.train_files and data.val_files both match {sorted(map(str, overlap))}: "
            "validation tokens must not be trained on"
        )
    return CorpusFiles(train=train, val=val)


def _how_to_fill(cfg: DataConfig) -> str:
    from data.corpus.fineweb import fetch_command  # the corpus tools load lazily

    if cfg.fineweb_shards:
        return (
            f"this run reads {cfg.fineweb_shards} FineWeb training shards (data.fineweb_shards="
            f"{cfg.fineweb_shards}): fetch them with {fetch_command(cfg.fineweb_shards, cfg.dir)}"
        )
    return (
        "download FineWeb with python -m data.corpus.fineweb --for experiment=NAME (or "
        "--train-shards N), or write shards with python -m data.corpus.prepare"
    )


def _check_fineweb(cfg: DataConfig, present: set[str]) -> None:
    """Refuse a FineWeb directory that lacks some of the shards the run reads: the loader
    would wrap around and train on repeated text."""
    from data.corpus.fineweb import shard_names

    missing = [n for n in shard_names(cfg.fineweb_shards)[1:] if n not in present]
    if missing:
        shown = missing[0] if len(missing) == 1 else f"{missing[0]} ... {missing[-1]}"
        raise FileNotFoundError(
            f"data.dir={cfg.dir!r} lacks {len(missing)} FineWeb training shard(s) ({shown}); "
            f"{_how_to_fill(cfg)} (the shards present are kept), or set data.fineweb_shards to "
            "the count present to train on those, reading some text more than once"
        )


def build_data(
    cfg: DataConfig,
    *,
    batch_size: int,
    seq_len: int,
    val_tokens: int,
    val_batch_size: int | None = None,
    val_seq_len: int | None = None,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    progress: bool = True,
) -> tuple[TokenLoader | PieceLoader | SyntheticLoader, Callable[[], Iterable[Batch]]]:
    """Return the train loader and a function that yields the same val batches every call.

    `batch_size` is global (all ranks); each rank reads its share. Validation runs in global
    batches of `val_batch_size` sequences (default `batch_size`) of `val_seq_len` tokens
    (default `seq_len`), which changes how the fixed validation set is cut, never which tokens
    it holds.
    """
    val_batch_size = val_batch_size or batch_size
    val_seq_len = val_seq_len or seq_len
    if cfg.source == "synthetic":
        loader = SyntheticLoader(batch_size, seq_len, seed=seed, rank=rank, world_size=world_size)

        def synthetic_val() -> Iterable[Batch]:
            return synthetic_val_batches(
                seed, val_tokens, val_batch_size, val_seq_len, rank, world_size
            )

        return loader, synthetic_val

    if cfg.source == "shards":
        files = find_shards(cfg)
    else:
        from data.corpus.sample import build_sample_corpus  # the corpus tools load lazily

        files = build_sample_corpus(
            Path(cfg.cache_dir).expanduser(), cfg.val_fraction, progress=progress
        )
    try:
        loader = _train_loader(cfg, files.train, batch_size, seq_len, rank, world_size)
    except NoBatch as e:
        if cfg.source != "sample":
            raise
        # The loader knows the shards' sizes, not that they are the embedded corpus: a batch
        # it cannot hold is a full-size preset on it, and the fix is the toy or the real corpus.
        raise NoBatch(f"{e}; {SAMPLE_AT_FULL_SIZE}") from e

    def sample_val() -> Iterable[Batch]:
        return val_batches(files.val, val_tokens, val_batch_size, val_seq_len, rank, world_size)

    sample_val()  # fail now, not at the first evaluation, if the val set is too small
    return loader, sample_val


def _train_loader(
    cfg: DataConfig, train: list[Path], batch_size: int, seq_len: int, rank: int, world_size: int
) -> TokenLoader | PieceLoader:
    """The training loader that cuts rows as data.align says."""
    if cfg.align == "pieces":
        return PieceLoader(train, batch_size, seq_len, cfg.max_piece_len, rank, world_size)
    return TokenLoader(train, batch_size, seq_len, rank, world_size, align=cfg.align)
