"""The `data` config group: where the tokens come from and how training rows are cut.

A field's `resume` metadata says how a checkpoint treats it (trainer/config.py: must_match,
operational).
"""

from dataclasses import dataclass, field

from stages.moved import refuse_moved

SOURCES = ("sample", "synthetic", "shards")
ALIGNS = ("stream", "bos", "pieces")


@refuse_moved("data")
@dataclass
class DataConfig:
    """The `data` group."""

    source: str = field(default="sample", metadata={"choices": SOURCES, "resume": "must_match"})
    """sample: the embedded Wikipedia corpus | synthetic: random tokens | shards: a directory
    of token shards (FineWeb's, or what `python -m data.corpus.prepare` wrote)."""
    cache_dir: str = field(default="~/.cache/gpt-speedrun", metadata={"resume": "operational"})
    """Where built shards are cached ("~" expands)."""
    val_fraction: float = 0.1
    """sample: the share of documents held out for validation."""
    dir: str = ""
    """shards: the directory holding them ("~" expands)."""
    train_files: str = "*_train_*.bin"
    """shards: the glob of the training shards, read in name order."""
    val_files: str = "*_val_*.bin"
    """shards: the glob of the validation shards."""
    align: str = field(default="stream", metadata={"choices": ALIGNS})
    """How training rows are cut: stream (consecutive windows, documents cut anywhere) | bos
    (every row starts at a document's <|endoftext|>) | pieces (every row is packed from whole
    document pieces of at most max_piece_len tokens, data/pieces.py). Validation is always the
    stream."""
    max_piece_len: int = 0
    """align=pieces: the most tokens kept of one document (its first ones); 0 = unset, and it
    must be set exactly when align=pieces. With a cap by stage (train.stages.rows.N.
    max_piece_len, which the loader switches on the first batch of a stage): their largest."""
    val_tokens: int = 49152
    """The validation budget this data's curves are usually reported on (train.val_tokens
    takes it unless set itself)."""
    fineweb_shards: int = field(default=0, metadata={"resume": "operational"})
    """FineWeb training shards (100M tokens each) the run reads, the one number a preset
    states: `python -m data.corpus.fineweb --for experiment=NAME` fetches that many, and a
    FineWeb data.dir holding fewer is refused with that command. Each record preset derives it
    in a comment (docs/data.md, "FineWeb shards per preset"); 0 = not stated (no check)."""

    def validate(self) -> None:
        """Raise ValueError naming the `data.*` key that is wrong (choices are checked by the
        config root, from each field's metadata)."""
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.cache_dir:
            raise ValueError("data.cache_dir must be a directory path")
        if self.val_tokens <= 0:
            raise ValueError(f"data.val_tokens must be positive, got {self.val_tokens}")
        if self.fineweb_shards < 0:
            raise ValueError(f"data.fineweb_shards must be >= 0, got {self.fineweb_shards}")
        if self.source == "shards":
            if not self.dir:
                raise ValueError(
                    "data.dir must name the directory of token shards for data.source=shards "
                    "(e.g. data.dir=/path/to/shards, written by python -m data.corpus.prepare)"
                )
            if not self.train_files or not self.val_files:
                raise ValueError("data.train_files and data.val_files must be glob patterns")
        if self.align in ("bos", "pieces") and self.source == "synthetic":
            raise ValueError(
                f"data.align={self.align} needs documents; data.source=synthetic has none"
            )
        if self.align == "pieces" and self.max_piece_len < 1:
            raise ValueError(
                f"data.max_piece_len must be >= 1 with data.align=pieces (the record uses "
                f"2048), got {self.max_piece_len}"
            )
        if self.align != "pieces" and self.max_piece_len != 0:
            raise ValueError(
                f"data.max_piece_len={self.max_piece_len} only applies to data.align=pieces "
                f"(data.align={self.align}); leave it 0"
            )
