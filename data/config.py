"""Typed configuration of the token data (the `data` config group)."""

from dataclasses import dataclass

DATA_SOURCES = ("sample", "synthetic")


@dataclass
class DataConfig:
    source: str = "sample"  # sample: embedded Wikipedia corpus | synthetic: random tokens
    cache_dir: str = "~/.cache/gpt-speedrun"  # where built shards are cached ("~" expands)
    val_fraction: float = 0.1  # sample corpus: share of documents held out for validation

    def validate(self) -> None:
        """Raise ValueError naming the `data.*` key that is wrong."""
        if self.source not in DATA_SOURCES:
            raise ValueError(f"data.source must be one of {DATA_SOURCES}, got {self.source!r}")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {self.val_fraction}")
        if not self.cache_dir:
            raise ValueError("data.cache_dir must be a directory path")
