"""Passes over the training data: each wrap is logged once with the distinct tokens of the pass
it ends, and the plan made before a run finds the step a real loader wraps at.

References: the real loader stepped batch by batch (its `epoch` and the tokens it returned,
which are all distinct within a pass because every shard token is unique here)."""

import logging

import numpy as np
import pytest

from data.loader import TokenLoader
from data.passes import PassPlan, plan_passes
from data.pieces import PieceLoader
from data.token_shards import write_shard

B = 50256  # the BOS


def unique_shards(tmp_path, lengths, bos_every=0):
    """Shards of distinct ids (shard i holds 1000·i + 0, 1, …), a BOS every `bos_every`."""
    tmp_path.mkdir(exist_ok=True)
    paths = []
    for i, n in enumerate(lengths):
        tokens = 1000 * i + np.arange(n)
        if bos_every:
            tokens[::bos_every] = B
        paths.append(tmp_path / f"train_{i:06d}.bin")
        write_shard(paths[-1], tokens)
    return paths


def walk(loader, steps):
    """(step of the first wrap or None, the input tokens read before it, wraps): a set of
    the distinct ids, and of each BOS as (BOS, its index), since every BOS has the same id."""
    seen, wrap, wraps = set(), None, 0
    for step, (seq_len, args) in enumerate(steps, start=1):
        before = loader.epoch
        x, _ = loader.next_batch(seq_len, **args)
        if loader.epoch != before:
            wraps += 1
            wrap = wrap or step
        if wrap is None:
            seen.update((t, len(seen)) if t == B else t for t in x.flatten().tolist())
    return wrap, seen, wraps


def loaders(tmp_path):
    stream = unique_shards(tmp_path / "s", [70, 50, 40])
    docs = unique_shards(tmp_path / "d", [90, 61], bos_every=7)
    return {
        "stream": (lambda: TokenLoader(stream, 3, 5), [(5, {})] * 20),
        "bos": (lambda: TokenLoader(docs, 2, 6, align="bos"), [(6, {})] * 20),
        "pieces": (
            lambda: PieceLoader(docs, 2, 4, 5),
            [(4 + 2 * (i % 3), {"max_piece_len": 3 + i % 4}) for i in range(24)],
        ),
    }


@pytest.fixture(params=["stream", "bos", "pieces"])
def case(request, tmp_path):
    return loaders(tmp_path)[request.param]


def test_the_plan_finds_the_real_wrap_and_leaves_the_loader_as_it_was(case, caplog) -> None:
    make, steps = case
    loader = make()
    state = loader.state_dict()
    plan = plan_passes(loader, steps)
    assert loader.state_dict() == state and not caplog.records, "planning changed the loader"
    with caplog.at_level(logging.WARNING, logger="data.passes"):
        wrap, seen, wraps = walk(make(), steps)
    assert wrap is not None and plan.wrap_step == wrap
    assert plan.pass_tokens == len(seen)  # every input token of the pass, each once
    assert (plan.steps, plan.tokens) == (len(steps), sum(loader.batch_size * n for n, _ in steps))
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == wraps >= 1, "one warning per wrap"
    assert "pass 2 begins (epoch 1" in logged[0] and f"after {len(seen):,} distinct" in logged[0]


def test_a_resumed_loader_plans_from_its_place_in_the_pass(case) -> None:
    make, steps = case
    uninterrupted = make()
    wrap, seen, _ = walk(uninterrupted, steps)
    first = make()
    for seq_len, args in steps[:2]:
        first.next_batch(seq_len, **args)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    plan = plan_passes(resumed, steps[2:])
    assert plan.wrap_step == wrap - 2 and plan.pass_tokens == len(seen)


def test_only_rank_0_logs_a_wrap(tmp_path, caplog) -> None:
    files = unique_shards(tmp_path, [40])
    with caplog.at_level(logging.WARNING, logger="data.passes"):
        for rank in (1, 0):
            loader = TokenLoader(files, 2, 4, rank=rank, world_size=2)
            for _ in range(6):
                loader.next_batch()
    assert len(caplog.records) == 1 and "after 32 distinct tokens" in caplog.text


def test_the_warning_gives_both_numbers_and_none_without_a_wrap(tmp_path) -> None:
    files = unique_shards(tmp_path, [1000])
    loader = TokenLoader(files, 4, 8)
    assert plan_passes(loader, [(8, {})] * 31).warning("here") is None  # 31 · 32 + 1 ≤ 1000
    plan = plan_passes(loader, [(8, {})] * 40)
    assert (plan.wrap_step, plan.pass_tokens, plan.tokens) == (32, 992, 1280)
    line = plan.warning("data.source=sample (1 shard(s), data.align=stream)")
    assert "40 steps read 1,280 training tokens" in line and "serves 992 per pass" in line
    assert "wraps around at step 32" in line and "read 1.3 times" in line
    assert PassPlan(5, 100, None, 0).passes == 1.0


def test_a_step_the_data_cannot_cut_ends_the_plan_there(tmp_path) -> None:
    files = unique_shards(tmp_path, [40])
    loader = TokenLoader(files, 2, 4)
    plan = plan_passes(loader, [(4, {})] * 3 + [(40, {})] + [(4, {})] * 5)
    assert (plan.steps, plan.wrap_step) == (3, None)
    for _ in range(3):
        loader.next_batch(4)
    with pytest.raises(ValueError, match="no training shard holds one global batch"):
        loader.next_batch(40)  # the run itself raises it, at that step
