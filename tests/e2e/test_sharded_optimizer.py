"""dist.parallelism=ddp_row_shards on 2 gloo ranks against one process, for every record preset's
optimizer settings, on the parameters of tests/unit/test_optimizer_compile.py (head-pair
stacks, MLP matrices with LR factors, Adam's tables with the tie and its split, scalars):

- each rank gets its own gradients, the reference their average (a/2 + b/2, the sum the
  reduce-scatter forms): the parameters after every step and the whole optimizer state
  (`state_dict`, gathered from the owners) equal one process's bit for bit. Where Adam
  updates every other step, each rank sums its own two gradients and only the sums are
  averaged (the records' order): the reference's Adam then gets zeros, then that average;
- a state saved inside a pair (every rank's own partial sum, stacked) and loaded into fresh
  ranks continues the run bit for bit; Newton–Schulz
  runs in fp32 here: in bf16 a CPU's batched matmul may round a matrix by what else is in
  its batch, and a rank batches fewer matrices than one process (the record's toy on two
  ranks shows bf16: tests/e2e/test_records.py);
- a one-process state loaded into two ranks and gathered back is the same state, so a
  checkpoint moves between world sizes;
- `LocalView(2, 0)` in one process computes rank 0's rows of a two-rank step whose ranks
  all hold that process's gradients (scripts/bench/gpu.py --world).
"""

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from optim.adam import Adam
from optim.adam_table import row_of
from optim.config import AdamWConfig
from optim.ddp_rows import LocalView, ProcessComm
from optim.muon.optimizer import Muon
from optim.tied import TiedEmbedHead
from tests.dist_utils import run_ranks
from tests.unit.test_optimizer_compile import PRESETS, adam_params, muon_params, settings

STEPS = 4


def build(preset: str, comm=None) -> tuple[list, list[torch.nn.Parameter]]:
    """The preset's Muon (banks, Newton–Schulz in fp32) and an optim/adam.py Adam with its
    settings (torch's AdamW's for #9 and #21, which sharded runs step with it)."""
    cfg = settings(preset)
    dtype = torch.bfloat16 if cfg.muon.master_weights != "none" else torch.float32
    mp = muon_params(cfg, dtype)
    muon = Muon(mp, cfg.muon, ns_dtype=torch.float32, banks=True, comm=comm)
    named = adam_params(dtype)
    rows = {n: row_of(pat, cfg.adamw) for n in named for pat in cfg.adamw.table
            if pat in (n, n.replace(".0.", ".*."))}  # fmt: skip
    adam = Adam([{"params": list(named.values()), "param_names": list(named), "lr": 0.008,
                  "weight_decay": cfg.adamw.weight_decay}], cfg.adamw, rows,
                comm=comm)  # fmt: skip
    if cfg.tie_embed_head_until:
        adam.tie = TiedEmbedHead(named["embed.weight"], named["lm_head.weight"], 2)
    return [muon, adam], [*mp, *named.values()]


def gradients(params: list, world: int) -> list[list[list[torch.Tensor]]]:
    """[step][rank][parameter]: each rank's own gradients."""
    gen = torch.Generator().manual_seed(3)
    return [[[torch.randn(p.shape, generator=gen).to(p.dtype) for p in params]
             for _ in range(world)] for _ in range(STEPS)]  # fmt: skip


def train(parts: list, params: list, grads: list, first_step: int = 0
          ) -> list[list[torch.Tensor]]:  # fmt: skip
    """The parameters after each step, `grads[step]` per parameter (the run's steps counted
    from `first_step`)."""
    out = []
    for step, gs in enumerate(grads, start=first_step):
        for opt in parts:
            for group in opt.param_groups:
                group["lr"] = group["lr"] * (0.9 if step else 1.0)
                if "momentum" in group:
                    group["momentum"] = 0.85 + 0.03 * step
        for p, g in zip(params, gs, strict=True):
            p.grad = g.clone()
        for opt in parts:
            opt.step()
        out.append([p.detach().clone() for p in params])
    return out


def _rank_main(rank: int, world: int, out: str) -> None:
    results = {}
    for preset in PRESETS:
        parts, params = build(preset, ProcessComm(dist.group.WORLD))
        grads = gradients(params, world)
        curve = train(parts, params, [g[rank] for g in grads])
        states = [opt.state_dict() for opt in parts]
        # A one-process state loaded here, then gathered back (the checkpoint round trip)
        ref_parts, ref_params = build(preset)
        train(ref_parts, ref_params, reference(ref_parts, ref_params, grads))
        fresh, _ = build(preset, ProcessComm(dist.group.WORLD))
        for opt, ref in zip(fresh, ref_parts, strict=True):
            opt.load_state_dict(ref.state_dict())
        round_trip = [opt.state_dict() for opt in fresh]
        # Stopped inside a pair (after step 3 of 4), saved, loaded into fresh ranks, resumed
        first, first_params = build(preset, ProcessComm(dist.group.WORLD))
        train(first, first_params, [g[rank] for g in grads[:3]])
        saved = [opt.state_dict() for opt in first]
        later, later_params = build(preset, ProcessComm(dist.group.WORLD))
        for opt, state in zip(later, saved, strict=True):
            opt.load_state_dict(state)
        with torch.no_grad():
            for p, q in zip(later_params, first_params, strict=True):
                p.copy_(q)
        resumed = train(later, later_params, [g[rank] for g in grads[3:]], first_step=3)[-1]
        results[preset] = (curve, states, round_trip, resumed)
    # Banks on ranks whose gradients DDP all-reduces would each run every bank: refused
    try:
        Muon(muon_params(settings(PRESETS[-1]), torch.bfloat16), settings(PRESETS[-1]).muon,
             banks=True, process_group=dist.group.WORLD)  # fmt: skip
        results["refusal"] = None
    except ValueError as e:
        results["refusal"] = str(e)
    torch.save(results, Path(out) / f"rank{rank}.pt")


def _average(per_rank: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """What the sharded reduction gives: each rank's gradient halved, then summed."""
    return [a / 2 + b / 2 for a, b in zip(*per_rank, strict=True)]


def reference(parts: list, params: list, grads: list) -> list[list[torch.Tensor]]:
    """One process's gradients [step][parameter] for the two ranks' `grads`: the average,
    and for an Adam that updates every k-th step, zeros until the update and then the
    average of each rank's own sum of the k gradients (summed in order from zeros, as a
    rank sums them)."""
    out = [_average(g) for g in grads]
    adam = parts[-1]
    k = adam.hp.update_every
    if k == 1:
        return out
    held = {id(p) for g in adam.param_groups for p in g["params"]}
    for i, p in enumerate(params):
        if id(p) not in held:
            continue
        for end in range(k - 1, len(grads), k):
            sums = []
            for rank in range(2):
                total = torch.zeros_like(p)
                for step in range(end - k + 1, end + 1):
                    total += grads[step][rank][i]
                sums.append(total)
            for step in range(end - k + 1, end):
                out[step][i] = torch.zeros_like(p)
            out[end][i] = sums[0] / 2 + sums[1] / 2
    return out


def _states_equal(a: list[dict], b: list[dict]) -> bool:
    for x, y in zip(a, b, strict=True):
        if x["state"].keys() != y["state"].keys():
            return False
        for n, s in x["state"].items():
            if s.keys() != y["state"][n].keys():
                return False
            if not all(torch.equal(s[k], y["state"][n][k]) for k in s):
                return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_sharded_ranks_are_one_process_bit_for_bit(tmp_path: Path) -> None:
    run_ranks(_rank_main, 2, str(tmp_path))
    refusal = torch.load(tmp_path / "rank0.pt")["refusal"]
    assert refusal is not None and "with dist.parallelism=ddp_row_shards; got" in refusal
    for preset in PRESETS:
        parts, params = build(preset)
        grads = gradients(params, 2)
        want = train(parts, params, reference(parts, params, grads))
        want_states = [opt.state_dict() for opt in parts]
        for rank in range(2):
            curve, states, round_trip, resumed = torch.load(tmp_path / f"rank{rank}.pt")[preset]
            for step, (a, b) in enumerate(zip(curve, want, strict=True)):
                same = [torch.equal(x, y) for x, y in zip(a, b, strict=True)]
                assert all(same), (preset, rank, step, same)
            assert _states_equal(states, want_states), (preset, rank)
            assert _states_equal(round_trip, want_states), (preset, rank)
            same = [torch.equal(x, y) for x, y in zip(resumed, curve[-1], strict=True)]
            assert all(same), (preset, rank, "resumed inside a pair", same)


def _rank_same_grads(rank: int, world: int, out: str) -> None:
    parts, params = build("record_2026_07_17", ProcessComm(dist.group.WORLD))
    grads = gradients(params, 1)
    curve = train(parts, params, [g[0] for g in grads])
    torch.save(curve, Path(out) / f"same{rank}.pt")


@pytest.mark.timeout(300)
def test_local_view_is_rank_zeros_share(tmp_path: Path) -> None:
    """LocalView(2, 0): the rows rank 0 updates equal a real rank 0's, every rank having
    the same gradients (this process's); the rows of rank 1 are not updated."""
    run_ranks(_rank_same_grads, 2, str(tmp_path))
    real = torch.load(tmp_path / "same0.pt")[-1]
    parts, params = build("record_2026_07_17", LocalView(2, 0))
    start = [p.detach().clone() for p in params]
    local = train(parts, params, [g[0] for g in gradients(params, 1)])[-1]
    muon, adam = parts
    for bank in muon.banked.all_banks:
        for p in bank.mine:
            i = next(k for k, q in enumerate(params) if q is p)
            assert torch.equal(local[i], real[i])
        for p in bank.params[bank.stop :]:
            i = next(k for k, q in enumerate(params) if q is p)
            assert torch.equal(local[i], start[i])
    first = len(params) - len(adam.shards.params)  # Adam's parameters come last
    for k, p in enumerate(params[first:], start=first):
        rows = adam.shards.rows.get(p)
        if rows is None:
            assert torch.equal(local[k], real[k])
        else:
            assert torch.equal(local[k][: rows.stop], real[k][: rows.stop])
            assert torch.equal(local[k][rows.stop :], start[k][rows.stop :])


# Adam's row-sharded tensors (at least SHARD_MIN_VALUES values): rows that split evenly over
# two ranks (gathered straight into the parameter), rows that do not (through the packed
# buffer), and a small tensor (averaged whole)
ROW_SHAPES = [(256, 300), (257, 300), (24,)]


def _row_adam(every: int, comm=None) -> tuple[Adam, list[torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(6)
    params = [torch.nn.Parameter(torch.randn(s, generator=gen).to(torch.bfloat16))
              for s in ROW_SHAPES]  # fmt: skip
    settings = AdamWConfig(eps_placement="raw", state_dtype="fp32", update_every=every)
    # ε the size of the gradients: Adam's step then depends on their scale (a missing
    # division by W shows)
    return Adam([{"params": params, "lr": 0.01, "weight_decay": 0.1, "eps": 0.5}], settings,
                comm=comm), params  # fmt: skip


def _row_grads() -> list[list[list[torch.Tensor]]]:
    gen = torch.Generator().manual_seed(5)
    return [[[torch.randn(s, generator=gen).to(torch.bfloat16) for s in ROW_SHAPES]
             for _ in range(2)] for _ in range(STEPS)]  # fmt: skip


def _rank_rows(rank: int, world: int, out: str) -> None:
    results = {}
    for every in (1, 2):
        adam, params = _row_adam(every, ProcessComm(dist.group.WORLD))
        shards = adam.shards
        assert shards is not None
        paths = ([p is params[0] for p, _ in shards.direct],
                 [params[1] in ps for ps, _ in shards.packed])  # fmt: skip
        results[every] = (train([adam], params, [g[rank] for g in _row_grads()]), paths)
    torch.save(results, Path(out) / f"rows{rank}.pt")


@pytest.mark.timeout(300)
def test_adams_row_shards_on_two_ranks_are_one_process_bit_for_bit(tmp_path: Path) -> None:
    """Each rank's rows of Adam's large tensors, reduced (the sum divided by W on the rows
    each rank receives) and gathered back (in place where the rows split evenly, packed
    where they do not), every step and every other (each rank's own pair sums): one process
    fed the average, bit for bit."""
    run_ranks(_rank_rows, 2, str(tmp_path))
    for every in (1, 2):
        adam, params = _row_adam(every)
        want = train([adam], params, reference([adam], params, _row_grads()))
        for rank in range(2):
            curve, (direct, packed) = torch.load(tmp_path / f"rows{rank}.pt")[every]
            assert direct == [True] and packed == [True]
            for step, (a, b) in enumerate(zip(curve, want, strict=True)):
                same = [torch.equal(x, y) for x, y in zip(a, b, strict=True)]
                assert all(same), (every, rank, step, same)
