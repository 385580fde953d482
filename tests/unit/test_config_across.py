"""Checks across config groups: each column of the stage table suits the group that reads it,
and every number is finite."""

import re

import pytest

from tests.helpers import compose_config
from trainer.config import to_config

NEWEST = ["experiment=record_2026_07_17", "run_dir=/tmp/unused"]


def test_the_newest_presets_stages_are_three_rows_of_every_column() -> None:
    """One row per stage: every column of record_2026_07_17 has three values, by construction."""
    table = to_config(compose_config(NEWEST)).train.stages
    assert len(table.rows) == 3
    for column in ("seq_len", "window", "max_piece_len", "max_pieces", "lr_peak", "mtp_weights"):
        assert len(table.column(column)) == 3, column


@pytest.mark.parametrize(
    ("override", "said"),
    [("data.align=stream data.max_piece_len=0",
      "train.stages.rows.N.max_piece_len only applies to data.align=pieces"),
     ("data.max_piece_len=4096", "data.max_piece_len (4096) must equal the largest"),
     ("optim.schedule.cooldown_form=steps",
      "train.stages.rows.N.lr_peak needs optim.schedule.cooldown_form=fraction or from_step"),
     ("model.head.mtp=false", "train.stages.rows.N.mtp_weights weigh model.head.mtp's loss"),
     ("model.attention.window= model.attention.key_offset=false",
      "train.stages.rows.N.window needs model.attention.window"),
     ("model.attention.window_tokens=128", "model.attention.window_tokens (a window growing"),
     ("train.seq_len=32768", "train.seq_len (32768) must equal the largest")],
)  # fmt: skip
def test_a_column_that_does_not_suit_its_group_is_named(override: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        to_config(compose_config([*NEWEST, *override.split()]))


def test_mtp_needs_its_weights_by_stage() -> None:
    with pytest.raises(ValueError, match=r"model\.head\.mtp=true needs the weights by stage"):
        to_config(compose_config([*NEWEST, "train.stages.mtp_decay=false",
                                  "train.stages.rows.0.mtp_weights=[]",
                                  "train.stages.rows.1.mtp_weights=[]",
                                  "train.stages.rows.2.mtp_weights=[]"]))  # fmt: skip


@pytest.mark.parametrize(
    ("override", "said"),
    [("optim.muon.lr=nan", "optim.muon.lr must be a finite number, got nan"),
     ("optim.adamw.head_lr=inf", "optim.adamw.head_lr must be a finite number, got inf"),
     ("train.stages.rows.1.mtp_weights=[1.0,nan]",
      "train.stages.rows.1.mtp_weights must be a finite number"),
     ("train.stages.rows.2.lr_peak=inf", "train.stages.rows.2.lr_peak must be a finite number"),
     ("train.reference.target=-inf", "train.reference.target must be a finite number")],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_named(override: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        to_config(compose_config([*NEWEST, override]))
