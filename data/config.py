"""Typed configuration of the token data (the `data` config group)."""

from dataclasses import dataclass

DATA_SOURCES = ("sample", "synthetic", "shards")
ALIGNS = ("stream", "bos")


@dataclass
class DataConfig:
    # sample: embedded Wikipedia corpus | synthetic: random tokens | shards: a directory of
    # token shards (FineWeb's, or what `python -m data.prepare` wrote)
    source: str = "sample"
    cache_dir: str = "~/.cache/gpt-speedrun"  # where built shards are cached ("~" expands)
    val_fraction: float = 0.1  # sample corpus: share of documents held out for validation
    dir: str = ""  # shards: the directory holding them ("~" expands)
    train_files: str = "*_train_*.bin"  # shards: glob of the training shards, read in name order
    val_files: str = "*_val_*.bin"  # shards: glob of the validation shards
    # How training rows are cut from the token stream. stream: consecutive seq_len windows,
    # documents cut anywhere | bos: every row starts at a document's <|endoftext|> (the rest of
    # a document that overflows a row is skipped). Validation is always the plain stream.
    align: str = "stream"
    # The validation budget this data's curves are usually reported on, in tokens;
    # train.val_tokens takes it unless set itself.
    val_tokens: int = 49152

    def validate(self) -> None:
        """Raise ValueError naming the `data.*` key that is wrong."""
        if self.source not in DATA_SOURCES:
            raise ValueError(f"data.source must be one of {DATA_SOURCES}, got {self.source!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.cache_dir:
            raise ValueError("data.cache_dir must be a directory path")
        if self.align not in ALIGNS:
            raise ValueError(f"data.align must be one of {ALIGNS}, got {self.align!r}")
        if self.val_tokens <= 0:
            raise ValueError(f"data.val_tokens must be positive, got {self.val_tokens}")
        if self.source == "shards":
            if not self.dir:
                raise ValueError(
                    "data.dir must name the directory of token shards for data.source=shards "
                    "(e.g. data.dir=/path/to/shards, written by python -m data.prepare)"
                )
            if not self.train_files or not self.val_files:
                raise ValueError("data.train_files and data.val_files must be glob patterns")
        if self.align == "bos" and self.source == "synthetic":
            raise ValueError("data.align=bos needs documents; data.source=synthetic has none")
