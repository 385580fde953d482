"""Training computes what it computed: short runs against curves recorded from an earlier
version of the code (`tests/e2e/baselines/tiny_curves.json`, fp32 so that it travels well).

On the machine they were recorded on (same torch, CPU, core count and threads: one per
process, as every process of the suite computes, tests/conftest.py) every loss must be bit
for bit the recorded one: a refactor of the loop, the optimizers or the config may not move
a single bit. Elsewhere the CPU's kernels may round differently, and the losses must agree to
1e-4, which still catches any change to what is computed (a schedule, a group's LR, an
update rule) over 20 steps. `scripts/check_baseline.py` does the same for the full default
run on 1 and 2 ranks.
"""

import json
from pathlib import Path

import pytest

from scripts.check_baseline import compare, curve, machine
from tests.helpers import TINY, compose_config
from train import train

BASELINE = json.loads((Path(__file__).parent / "baselines" / "tiny_curves.json").read_text())


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", list(BASELINE["runs"]))
def test_losses_match_the_recorded_curve(name: str, tmp_path: Path, corpus_cache: Path) -> None:
    want = BASELINE["runs"][name]
    overrides = [*TINY, *BASELINE["common"], *want["overrides"]]
    train(compose_config([*overrides, f"run_dir={tmp_path}", f"data.cache_dir={corpus_cache}"]))
    equal, worst = compare(curve(tmp_path), want["losses"])
    if BASELINE["machine"] == machine():
        assert equal, f"not bitwise equal to the recorded curve (max |diff| {worst:.3g})"
    else:
        assert worst <= 1e-4, f"max |diff| {worst:.3g} against the recorded curve"
