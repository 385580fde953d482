"""The stage table (`train.stages`) and the one rule that places a step in a stage.

A record's training is a few stages, each a row of what the run does in it: the sequence
length, the long attention window, the document-piece cap and limit, the LR plateau, the
multi-token weights. The scheduled steps S = train.steps − train.extension_steps split into
P = len(rows) equal stages, and step s is in stage

    i(s) = min(⌊P·s / S⌋, P − 1)                                        (`stage_index`)

in integers, so the boundaries are exact (record_2025_11_29: 2,120 steps, stage 1 from 707, stage 2
from 1,414; record_2026_07_17: 1,380 steps, 460 and 920); the extension steps after S are in the
last. Stage i starts at ⌈i·S / P⌉ (`stage_start`). The model, the data, the optimizer and the
trainer all read the current row through `StageTable.index`, so every column switches at the same
step: one row per stage makes a disagreement impossible.

A column that no row sets (0, or [] for the MTP weights) leaves its key's global value in
place (train.seq_len, data.max_piece_len, ...); a column is set in every row or in none.
Torch-free and importing nothing of the project: every package may import it.
"""

import itertools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

MUST_MATCH = {"resume": "must_match"}  # how a checkpoint treats the key (trainer/config.py)
OPERATIONAL = {"resume": "operational"}
KEY = "train.stages"


def stage_index(step: int, scheduled_steps: int, n_stages: int) -> int:
    """The stage of `step` among `n_stages` equal stages of `scheduled_steps`:
    min(⌊P·step / S⌋, P − 1), in integers (exact; the extension steps are in the last).
    record_2025_11_29 (P = 3, S = 2,120): 0 up to 706, 1 for 707 … 1,413, 2 from 1,414 on."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if n_stages < 1 or scheduled_steps < 1:
        raise ValueError(f"need a stage and a scheduled step, got {n_stages} and {scheduled_steps}")
    return min(n_stages * step // scheduled_steps, n_stages - 1)


def stage_start(index: int, scheduled_steps: int, n_stages: int) -> int:
    """The first step of stage `index` (`stage_index`): ⌈index·S / P⌉."""
    return -(-index * scheduled_steps // n_stages)


@dataclass
class Stage:
    """One row of `train.stages`: what changes at that stage. 0 (or []) = not set by this
    table, the key's global value holds."""

    seq_len: int = 0
    """Tokens per rank sequence in this stage (record_2025_11_29 and D: 16,384 / 32,768 / 49,152);
    0 = train.seq_len. train.seq_len must be the largest (it sizes the buffers)."""
    window: int = field(default=0, metadata=MUST_MATCH)
    """The long attention window in blocks of model.attention.window_block (record_2025_11_29 and
    record_2026_07_17: 3, 7, 11); the short one is ⌊window/2⌋ and the YaRN stage is the row's index.
    0 = no window by stage (model.attention.window_tokens's linear growth, or none)."""
    max_piece_len: int = 0
    """data.align=pieces: the most tokens kept of one document in this stage (record_2026_07_17:
    896, 2,048, 2,048, #72); 0 = data.max_piece_len, which must be the largest."""
    max_pieces: int = field(default=0, metadata=OPERATIONAL)
    """data.align=pieces: the most document pieces one rank sequence may hold (record_2026_07_17:
    63, 95, 127, its cu_seqlens of 64 / 96 / 128, #78); a batch that needs more fails naming this
    key, never truncates. 0 = no limit."""
    lr_peak: float = 0.0
    """The LR multiplier's plateau in this stage, the cooldown falling from the current one
    (record_2025_11_29: 1, 1.51, 1.93; record_2026_07_17: 1, 1.52, 1.73); needs
    optim.schedule.cooldown_form= fraction or from_step. 0 = no plateaus (the multiplier peaks at
    1)."""
    mtp_weights: list[float] = field(default_factory=list, metadata=MUST_MATCH)
    """model.head.mtp: the weights w_0 … w_{K−1} of the tokens 1 … K ahead in this stage
    (record_2026_07_17: [1, 0.5, 0.25], [1, 0.5], [1]); the forward takes them padded with zeros to
    the longest row's length."""


COLUMNS = tuple(f.name for f in fields(Stage))
WHOLE = ("seq_len", "window", "max_piece_len", "max_pieces")  # whole numbers >= 1 where set


@dataclass
class StageTable:
    """`train.stages`: one row per stage, and what follows the stages."""

    rows: list[Stage] = field(default_factory=list)
    """The stages in order, each an equal share of the scheduled steps (`stage_index`);
    [] = one stage, every key at its global value."""
    window_after: int = field(default=0, metadata=MUST_MATCH)
    """The long window over the extension steps, in blocks (record_2025_11_29 and record_2026_07_17:
    13; a YaRN stage of its own, index len(rows)); 0 = the last row's."""
    window_final_eval: int = field(default=0, metadata=MUST_MATCH)
    """The long window of the final validation only, in blocks (record_2025_11_29 and
    record_2026_07_17: 20); the short one and the YaRN stage stay the last step's. 0 = the last
    step's."""
    mtp_decay: bool = field(default=False, metadata=MUST_MATCH)
    """The last weight of a row of two or more MTP weights falls linearly to 0 over its stage,
    w·(1 − (P·x − i)) at x = s/S in stage i (record_2026_07_17: 0.25·(1 − s/460) in stage 0, then
    0.5·(1 − (s − 460)/460)); false = each row's weights hold through its stage."""
    peak_edges: list[float] = field(default_factory=list)
    """Where the LR plateau steps up, in x = step / scheduled steps: row i + 1's lr_peak from
    x > edge i on, instead of at the stage boundaries (record_2025_11_29: [0.33, 0.66], the peaks at
    700 and 1,400 of 2,120, before the batch at 707 and 1,414); one fewer than the rows.
    [] = the plateaus switch with the stages (record_2026_07_17)."""
    columns: dict[str, list[Any]] = field(default_factory=dict)
    """Whole columns by name, each replacing that column's value in every row, in order: how a
    size overlay (conf/size/) shortens a preset's stages without restating its rows (a YAML
    list merges whole, so `rows` in an overlay would drop the columns it does not name); e.g.
    {seq_len: [64, 128, 256]}. Applied when the table is built, after which it is {}."""

    def __post_init__(self) -> None:
        for name, values in self.columns.items():
            if name not in COLUMNS:
                raise ValueError(
                    f"{KEY}.columns.{name} is not a column of the stage table "
                    f"(have: {', '.join(COLUMNS)})"
                )
            if len(values) != len(self.rows):
                raise ValueError(
                    f"{KEY}.columns.{name} has {len(values)} values for the {len(self.rows)} "
                    f"rows of {KEY}.rows: one per row"
                )
            for row, value in zip(self.rows, values, strict=True):
                setattr(row, name, value)
        self.columns = {}

    def index(self, step: int, scheduled_steps: int) -> int:
        """The stage of `step` (`stage_index` over the rows)."""
        return stage_index(step, scheduled_steps, len(self.rows))

    def row(self, step: int, scheduled_steps: int) -> Stage:
        """The row of `step`."""
        return self.rows[self.index(step, scheduled_steps)]

    def start(self, index: int, scheduled_steps: int) -> int:
        """The first step of stage `index` (`stage_start`)."""
        return stage_start(index, scheduled_steps, len(self.rows))

    def column(self, name: str) -> list:
        """The column's value in each row, or [] where no row sets it."""
        values = [getattr(r, name) for r in self.rows]
        return values if any(values) else []

    @property
    def long_windows(self) -> list[int]:
        """The long windows in blocks, in order: each row's, then window_after if set. The
        YaRN stages follow it: stage k = after k changes (model/yarn.py)."""
        return [*self.column("window"), *([self.window_after] if self.window_after else [])]

    def validate(self, scheduled_steps: int) -> None:
        """Raise ValueError naming the `train.stages` key (and row) that is wrong."""
        for i, row in enumerate(self.rows):
            _validate_row(row, f"{KEY}.rows.{i}")
        for name in COLUMNS:
            values = [getattr(r, name) for r in self.rows]
            if any(values) and not all(values):
                unset = next(i for i, v in enumerate(values) if not v)
                raise ValueError(
                    f"{KEY}.rows.{unset}.{name} is unset ({values[unset]!r}) while other rows "
                    "set it: a column is set in every row or in none"
                )
        if len(self.rows) > scheduled_steps:
            raise ValueError(
                f"{KEY}.rows has {len(self.rows)} stages, more than the {scheduled_steps} "
                "scheduled steps (train.steps - train.extension_steps)"
            )
        for key in ("window_after", "window_final_eval"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{KEY}.{key} must be whole blocks >= 0, got {value!r}")
        for key, column in (("window_after", "window"), ("window_final_eval", "window"),
                            ("mtp_decay", "mtp_weights"), ("peak_edges", "lr_peak")):  # fmt: skip
            if getattr(self, key) and not self.column(column):
                raise ValueError(f"{KEY}.{key} needs the rows' {column} ({KEY}.rows.N.{column})")
        edges = list(self.peak_edges)
        if edges and len(edges) != len(self.rows) - 1:
            raise ValueError(
                f"{KEY}.peak_edges needs one edge fewer than the {len(self.rows)} rows, or none "
                f"(the plateaus switch with the stages), got {len(edges)}: {edges}"
            )
        if not all(a < b for a, b in itertools.pairwise([0.0, *edges, 1.0])):
            raise ValueError(f"{KEY}.peak_edges must rise strictly inside (0, 1), got {edges}")


ROW_KEY = re.compile(r"train\.stages\.rows(?:\.\d+(?:\.(\w+))?)?")


def refuse_rows_under_columns(overrides: list[str], columns: Mapping[str, list]) -> None:
    """Raise ValueError for a command-line override of the rows that `train.stages.columns`
    (a size overlay's) would overwrite when the table is built: the override would be lost."""
    for word in overrides if columns else ():
        key = word.split("=")[0].lstrip("+~")
        match = ROW_KEY.fullmatch(key)
        if match and (match.group(1) is None or match.group(1) in columns):
            name = match.group(1) or next(iter(columns))
            raise ValueError(
                f"{key}: {KEY}.columns sets the column(s) {', '.join(columns)} of every row "
                f"after the rows are read (a size overlay's: {dict(columns)}), so this override "
                f"would be lost; set the column instead: '{KEY}.columns.{name}=[...]', one value "
                "per row"
            )


def _validate_row(row: Stage, key: str) -> None:
    """One row's values: whole numbers >= 1 (or 0, unset), a finite peak, finite weights."""
    for name in WHOLE:
        value = getattr(row, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key}.{name} must be a whole number >= 1 (0 = unset), got {value!r}")
    if not (isinstance(row.lr_peak, int | float) and 0 <= row.lr_peak < math.inf):
        raise ValueError(
            f"{key}.lr_peak must be a finite number > 0 (0 = unset), got {row.lr_peak}"
        )
    weights = list(row.mtp_weights)
    if not all(isinstance(w, int | float) and 0 <= w < math.inf for w in weights):
        raise ValueError(f"{key}.mtp_weights must be finite weights >= 0, got {weights}")
