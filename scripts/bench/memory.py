"""Per-rank memory of parameters, gradients and optimizer state: ddp, fsdp, fsdp+offload.

Computed for GPT-2 124M / 350M / 774M / 1.5B shapes in this project's model (vocab padded to
50304, untied head, no biases or norm gains), at a world size of W ranks. Parameters are
counted per optimizer group (`partition_params`) on a meta-device model, then in bytes:

    fp32 parameters 4/param, fp32 gradients 4/param, Muon momentum 4 per Muon param,
    AdamW exp_avg + exp_avg_sq 8 per AdamW param (its 0-D step counters: 4 B per tensor,
    negligible and left out)

ddp holds all of it on every rank. fsdp holds each tensor's dim-0 shard: ⌈rows/W⌉ rows on
the fullest rank (FSDP2 pads every rank's parameter and gradient storage to that), so 1/W
when W divides the rows. fsdp+offload keeps the sharded parameters and gradients on the
device and the sharded optimizer state in (pinned) host memory; `step()` brings every part's
state back to the device for the update, so the device peak then is the fsdp figure.

Transient under fsdp: the units (each embedding table, each block, the root = head and
scalars) are all-gathered in the param dtype (b bytes: bf16 = 2 with dist.fsdp_param_dtype
=auto on GPU) and reduce-scattered in fp32. The root stays gathered from the start of the
forward to the end of the backward (FSDP2 does not reshard the root after forward), and the
root's and embedding's gradients are reduced only at the end of the backward (their input,
the token ids, needs no gradient, so their post-backward hook waits for the final callback).
With R the root's, E the embedding tables' and B the largest block's parameter count:

    end of backward   (b + 4)·R + 2b·E    root grad + its fp32 reduce-scatter input, while the
                                          embedding's params and grad are still unsharded
    mid backward      2b·R + 3b·B + 4·B   root params + grad held; a block and the prefetched
                                          next one, the block's grad and its fp32 RS input
    gathered units    max of the two      (the forward's b·(R + 2E) is always below the first)

For every GPT-2 size the embedding and head are the largest units (V·d > 12·d² while
d < V/12), and the end of backward dominates. The simpler rule "current + prefetched unit
and one unit's gradient", 3b·max(R, E, B), omits the fp32 reduce-scatter input and the root
held through the backward; it is about 60% of the above.

Measured (--measure): 2 gloo ranks on this CPU run one training step of the tiny default
model and of 124M under each setup, then count the storage bytes this rank's tensors hold:
parameter and gradient shards (the gradients when backward ends, before the step, whose
sharded Muon drops its own as it takes them), optimizer state on the device, and offload's
host mirrors.
On CPU fsdp gathers in fp32, which changes only the transient, not these numbers.

    python -m scripts.bench.memory                 # computed table, W=8
    python -m scripts.bench.memory --world 64
    python -m scripts.bench.memory --measure       # + measured vs computed at W=2 (~1 min)
    python -m scripts.bench.memory --measure --quick   # tiny model only
"""

import argparse
import gc
import os
from collections.abc import Iterable
from dataclasses import replace

import torch
import torch.distributed as dist
from torch import Tensor, nn

from model.config import ModelConfig
from model.gpt import GPT
from optim.fsdp_rows import local, numel_of_rows, row_counts
from optim.groups import partition_params
from scripts.bench import presets
from trainer.build import build_run
from trainer.launch.dist import free_port
from trainer.runtime import Runtime

# GPT-2 sizes as (n_layer, n_embd, n_head); everything else is ModelConfig's default.
GPT2 = {
    "124M": (12, 768, 12),
    "350M": (24, 1024, 16),
    "774M": (36, 1280, 20),
    "1.5B": (48, 1600, 25),
}
SETUPS = ("ddp", "fsdp", "fsdp+offload")
PARTS = ("params", "grads", "state", "host")  # bytes per rank; "state" is on the device
FP32 = 4
STATE_BYTES = {"muon": 4, "embed": 8, "head": 8, "scalar": 8}  # momentum | exp_avg + exp_avg_sq
GIB, MIB = 2**30, 2**20
MEASURE_WORLD = 2


def gpt2_config(name: str) -> ModelConfig:
    n_layer, n_embd, n_head = GPT2[name]
    return ModelConfig(n_layer=n_layer, n_embd=n_embd, n_head=n_head)


def _rows_on_fullest_rank(shape: torch.Size, world: int) -> int:
    """Values of the largest dim-0 shard (rank 0's); a 0-D tensor is one value, unsharded."""
    return numel_of_rows(shape, row_counts(shape[0], world)[0]) if shape else 1


def computed(cfg: ModelConfig, world: int, param_bytes: int = 2) -> dict:
    """Per-rank bytes of each setup ({part: bytes} over PARTS), parameter counts, and the
    fsdp transient ("gathered", with `param_bytes` the all-gather dtype's size)."""
    with torch.device("meta"):  # shapes only: no memory, no init cost
        model = GPT(cfg)
    groups = partition_params(model, "muon_adamw")
    full = {g: sum(p.numel() for _, p in named) for g, named in groups.items()}
    shard = {g: sum(_rows_on_fullest_rank(p.shape, world) for _, p in named)
             for g, named in groups.items()}  # fmt: skip
    n, n_shard = sum(full.values()), sum(shard.values())
    state = sum(STATE_BYTES[g] * k for g, k in full.items())
    state_shard = sum(STATE_BYTES[g] * k for g, k in shard.items())
    embed = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Embedding))
    blocks = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
    root, block, b = n - embed - sum(blocks), max(blocks, default=0), param_bytes
    end_of_backward = (b + FP32) * root + 2 * b * embed
    mid_backward = 2 * b * root + 3 * b * block + FP32 * block
    sharded = {"params": FP32 * n_shard, "grads": FP32 * n_shard}
    return {
        "params": n,
        "groups": full,
        "ddp": {"params": FP32 * n, "grads": FP32 * n, "state": state, "host": 0},
        "fsdp": {**sharded, "state": state_shard, "host": 0},
        "fsdp+offload": {**sharded, "state": 0, "host": state_shard},
        "gathered": max(end_of_backward, mid_backward),
    }


def held_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of the distinct storages behind `tensors` (views of one buffer count once, as
    DDP's bucketed gradients and FSDP2's reduce-scatter output are)."""
    storages: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.nbytes():  # a freed (offloaded) storage holds nothing
            storages[st.data_ptr()] = max(storages.get(st.data_ptr(), 0), st.nbytes())
    return sum(storages.values())


def measure_rank(cfg: ModelConfig, setup: str, tokens: int = 64) -> dict[str, int]:
    """This rank's bytes ({part: bytes} over PARTS, plus "counters": the 0-D step counters)
    after one training step of `cfg` under `setup`, on CPU, in the default process group."""
    rank, world = dist.get_rank(), dist.get_world_size()
    rt = Runtime(rank, world, rank, torch.device("cpu"), None)
    fsdp = setup != "ddp"
    conf = presets.hydra_config([
        "run_dir=.", "train.device=cpu", f"train.batch_size={world}",
        f"dist.parallelism={'fsdp_gather' if fsdp else 'ddp_all_gather'}",
        f"optim.offload={setup == 'fsdp+offload'}",
    ])  # fmt: skip
    # As train.py builds it (fsdp gathers in fp32 on a CPU: dist.fsdp_param_dtype=auto)
    run = build_run(replace(conf, model=cfg), presets.PARTS, rt, dist.group.WORLD, data=False)
    model, optimizer, forward = run.model, run.optimizer, run.fwd
    idx = torch.randint(0, 50257, (1, tokens + 1), generator=torch.Generator().manual_seed(rank))
    forward(idx[:, :-1], idx[:, 1:]).backward()
    params = list(model.parameters())
    # Read before the step: the gradients are all held once backward ends, and the sharded
    # Muon drops its own during the step (optim.muon.free_grads)
    grads = held_bytes(local(p.grad) for p in params if p.grad is not None)
    optimizer.step()
    states = [v for opt in optimizer.parts for s in opt.state.values() for v in s.values()]
    states = [local(v) for v in states if isinstance(v, Tensor)]
    mirrors = optimizer.offload._mirrors.values() if optimizer.offload is not None else []
    out = {
        "params": held_bytes(local(p) for p in params),
        "grads": grads,
        "state": held_bytes(v for v in states if v.ndim > 0),
        "host": held_bytes(mirrors),
        "counters": held_bytes(v for v in states if v.ndim == 0),
    }
    del run, forward, model, optimizer, params, states
    gc.collect()
    return out


def max_over_ranks(values: dict[str, int]) -> dict[str, int]:
    """Each entry's maximum over the default group's ranks (the rank that needs the most)."""
    t = torch.tensor(list(values.values()), dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return dict(zip(values, t.tolist(), strict=True))


def _measure_ranks(rank: int, port: int, names: list[str], queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=MEASURE_WORLD)
    torch.set_num_threads(1)  # one core per rank
    try:
        for name in names:
            cfg = ModelConfig() if name == "tiny" else gpt2_config(name)
            for setup in SETUPS:
                got = max_over_ranks(measure_rank(cfg, setup))
                if rank == 0:
                    queue.put((name, setup, got))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def measure(names: list[str]) -> dict[tuple[str, str], dict[str, int]]:
    """{(model, setup): per-rank bytes, max over ranks} from MEASURE_WORLD spawned gloo ranks."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    torch.multiprocessing.start_processes(
        _measure_ranks, args=(free_port(), names, queue), nprocs=MEASURE_WORLD, join=True,
        start_method="spawn",
    )  # fmt: skip
    results = {}
    while not queue.empty():
        name, setup, got = queue.get()
        results[(name, setup)] = got
    return results


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f}"


def computed_table(world: int, param_bytes: int) -> str:
    dtype = "bf16" if param_bytes == 2 else "fp32"
    lines = [
        f"Per-rank memory at W={world}, GiB (2^30 B): fp32 parameters + fp32 gradients + "
        "optimizer state (Muon momentum, AdamW moments). Activations, the CUDA context and "
        "communication buffers are not included. Gathered units: the fsdp peak of unsharded "
        "parameters, their gradients and the fp32 reduce-scatter input, on top of the sharded "
        "figure. fsdp+offload device: between updates; `step()` brings the state back, so "
        "during the update the device holds the fsdp sharded figure.",
        "",
        "| model | params | Muon / AdamW | ddp (GiB/rank) | fsdp sharded | "
        f"fsdp gathered units (transient, {dtype}) | fsdp+offload device | fsdp+offload host |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in GPT2:
        c = computed(gpt2_config(name), world, param_bytes)
        g = c["groups"]
        off = c["fsdp+offload"]
        adamw = c["params"] - g["muon"]
        lines.append(
            f"| {name} | {c['params'] / 1e6:.1f}M | {g['muon'] / 1e6:.1f}M / {adamw / 1e6:.1f}M "
            f"| {_gib(sum(c['ddp'].values()))} | {_gib(sum(c['fsdp'].values()))} "
            f"| {_gib(c['gathered'])} | {_gib(off['params'] + off['grads'])} "
            f"| {_gib(off['host'])} |"
        )
    return "\n".join(lines)


def measured_table(results: dict[tuple[str, str], dict[str, int]]) -> str:
    lines = [
        f"Measured after one step on {MEASURE_WORLD} gloo ranks (CPU) vs computed for "
        f"W={MEASURE_WORLD}: MiB per rank (max over ranks), measured / computed.",
        "",
        "| model | setup | params | grads | state (device) | state (host) | difference |",
        "|---|---|---|---|---|---|---|",
    ]
    counters = []
    for (name, setup), got in results.items():
        cfg = ModelConfig() if name == "tiny" else gpt2_config(name)
        want = computed(cfg, MEASURE_WORLD)[setup]
        cells = [f"{got[k] / MIB:.2f} / {want[k] / MIB:.2f}" for k in PARTS]
        diff = {k: got[k] - want[k] for k in PARTS if got[k] != want[k]}
        verdict = (
            "none (exact)" if not diff else ", ".join(f"{k} {v:+d} B" for k, v in diff.items())
        )
        lines.append(f"| {name} | {setup} | {' | '.join(cells)} | {verdict} |")
        counters.append(f"{name} {setup}: {got['counters']} B")
    lines += ["", "AdamW step counters (0-D, not in the formula): " + "; ".join(counters)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=8, help="ranks for the computed table")
    parser.add_argument(
        "--fsdp-param-dtype", choices=("bf16", "fp32"), default="bf16",
        help="all-gather dtype for the transient column (bf16 = dist.fsdp_param_dtype=auto on GPU)",
    )  # fmt: skip
    parser.add_argument("--measure", action="store_true", help="also measure on 2 CPU ranks")
    parser.add_argument("--quick", action="store_true", help="measure the tiny model only")
    args = parser.parse_args()
    if args.world < 1:
        parser.error("--world must be >= 1")
    print(computed_table(args.world, 2 if args.fsdp_param_dtype == "bf16" else 4))
    if args.measure:
        print()
        print(measured_table(measure(["tiny"] if args.quick else ["tiny", "124M"])))


if __name__ == "__main__":
    main()
