"""Checks across config groups: the stage lists of a record agree on the number of stages."""

import re

import pytest

from tests.helpers import compose_config
from trainer.config import to_config
from trainer.config_across import stage_lists

NEWEST = ["experiment=record_2026_07_17", "run_dir=/tmp/unused"]


def test_the_newest_presets_stage_lists_all_have_three_stages() -> None:
    stages = stage_lists(to_config(compose_config(NEWEST)))
    assert set(stages) == {
        "train.seq_len_phases", "model.attention.window_phases", "data.max_piece_len_phases",
        "data.max_pieces", "model.head.mtp_weights", "optim.schedule.peaks",
    }  # fmt: skip
    assert {len(v) for v in stages.values()} == {3}


@pytest.mark.parametrize(
    "override",
    ["train.seq_len_phases=[16384,49152]", "data.max_pieces=[63,95,127,127]",
     "optim.schedule.peaks=[1.0,1.5]", "model.head.mtp_weights=[1.0,0.5]"],
)  # fmt: skip
def test_a_stage_list_of_another_length_is_refused_naming_every_list(override: str) -> None:
    key = override.split("=")[0]
    # Two batch stages with the data lists to match: the model's and optimizer's still have 3
    data = ["data.max_piece_len_phases=[896,2048]", "data.max_pieces=[63,95]"]
    overrides = [override, *data] if key == "train.seq_len_phases" else [override]
    with pytest.raises(ValueError, match="the stage lists disagree on the number of stages") as e:
        to_config(compose_config([*NEWEST, *overrides]))
    assert "model.attention.window_phases=[3, 7, 11] (3)" in str(e.value)
    assert f"{key}=" in str(e.value) and "give them all the same length" in str(e.value)


def test_one_entry_is_a_constant_and_peaks_with_edges_have_their_own_phases() -> None:
    to_config(compose_config([*NEWEST, "data.max_pieces=[127]"]))
    c = to_config(compose_config(["experiment=record_2025_11_29", "run_dir=/tmp/unused"]))
    assert "optim.schedule.peaks" not in stage_lists(c)  # #46 places its peaks by edges


@pytest.mark.parametrize(
    ("override", "said"),
    [("optim.muon.lr=nan", "optim.muon.lr must be a finite number, got nan"),
     ("optim.adamw.head_lr=inf", "optim.adamw.head_lr must be a finite number, got inf"),
     ("model.head.mtp_weights=[1.0,nan]", "model.head.mtp_weights must be a finite number"),
     ("train.reference.target=-inf", "train.reference.target must be a finite number")],
)  # fmt: skip
def test_a_number_that_is_not_finite_is_named(override: str, said: str) -> None:
    with pytest.raises(ValueError, match=re.escape(said)):
        to_config(compose_config([*NEWEST, override]))
