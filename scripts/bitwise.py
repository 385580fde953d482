"""Do two commits compute the same thing? Train the default run, records A–D and M at toy size,
on 1 and 2 ranks, in this tree and in another commit's, and compare the final checkpoints
bit for bit (every parameter, buffer and optimizer tensor) and the logged losses.

    python scripts/bitwise.py --against ff14338                  # every case, 1 and 2 ranks
    python scripts/bitwise.py --against HEAD~1 --cases D --ranks 1

A refactor that renames a checkpoint key is compared through the loader's own upgrade
(`trainer/checkpoint/upgrade.py`): the other commit's checkpoint is read as a resume reads
it, so the comparison also shows that old checkpoints still load. The other commit runs in a
`git worktree` under --work (kept between calls: its runs are cached by commit and case).
Both sides run with one thread per rank: a CPU's sums may split by thread.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a file: the repository's packages come first
    sys.path.insert(0, str(REPO))

COMMON = [
    "data=sample", "model.compile=false", "train.device=cpu", "train.threads=1",
    "train.checkpoint_every=0", "train.checkpoint_at_end=true", "train.val_tokens=2048",
    "dist.timeout_s=120",
]  # fmt: skip
SMALL = ["model.n_layer=4", "model.n_head=2", "model.n_embd=64", "train.batch_size=2",
         "train.micro_batch_size=1"]  # fmt: skip
# Each case: the overrides of the other commit and of this tree (the same unless a key was
# renamed in between; then this tree's spelling goes in `now`).
# fmt: off
CASES: dict[str, dict[str, list[str]]] = {
    "default": {"base": ["train.steps=4", "train.val_every=4", "train.seq_len=128"]},
    "A": {
        "base": ["experiment=record_2024_11_06", *SMALL, "train.seq_len=256", "train.steps=4",
                 "train.val_every=4"],
    },
    "B": {
        "base": ["experiment=record_2025_01_26", *SMALL, "train.seq_len=512", "train.steps=4",
                 "train.val_every=4"],
    },
    "C": {
        "base": ["experiment=record_2025_11_29", *SMALL, "model.residual.skips=[[1,2]]",
                 "model.residual.backout_layer=2",
                 "model.attention.window_block=16", "train.seq_len=512",
                 "train.stages.rows.0.seq_len=128", "train.stages.rows.1.seq_len=256",
                 "train.stages.rows.2.seq_len=512", "train.steps=6",
                 "train.extension_steps=2", "optim.muon.momentum_warmup_steps=3",
                 "optim.muon.momentum_cooldown_steps=2", "train.val_every=8"],
    },
    "D": {
        "base": ["experiment=record_2026_07_17", "model.n_embd=48", "model.n_head=6",
                 "model.bigram.rows=256", "model.bigram.dim=8",
                 "model.residual.mudd_hidden=4", "model.attention.window_block=16",
                 "train.seq_len=256", "train.stages.rows.0={seq_len:64,max_piece_len:32}",
                 "train.stages.rows.1={seq_len:128,max_piece_len:64}",
                 "train.stages.rows.2={seq_len:256,max_piece_len:64}",
                 "train.batch_size=2", "train.micro_batch_size=1", "train.steps=8",
                 "train.extension_steps=1",
                 "train.val_every=9", "data.max_piece_len=64", "optim.tie_embed_head_until=5",
                 "optim.muon.momentum_warmup_steps=3", "optim.muon.momentum_cooldown_steps=2"],
    },
    # record M's toy of tests/e2e/test_records.py: 8 of its 16 layers, its twelve stages one
    # step each, the head tied until step 3
    "M": {
        "base": ["experiment=record_medium_2025_12_31", "model.n_layer=8",
                 "model.residual.skips=[[3,4],[2,5],[1,5]]", "model.residual.backout_layer=5",
                 "model.n_embd=64", "model.n_head=4", "model.attention.window_block=8",
                 "train.seq_len=128",
                 *(f"train.stages.rows.{i}.seq_len={32 * min(i + 1, 4)}" for i in range(12)),
                 "train.batch_size=2", "train.micro_batch_size=1", "train.steps=12",
                 "train.extension_steps=0", "train.val_every=6", "optim.tie_embed_head_until=3",
                 "optim.muon.momentum_warmup_steps=3", "optim.muon.momentum_cooldown_steps=2"],
    },
}
# fmt: on


def respelled(base: list[str], changes: dict[str, list[str]]) -> list[str]:
    """`base` with each override whose key is in `changes` replaced by that list."""
    out = []
    for word in base:
        out += changes.get(word.split("=")[0], [word])
    return out


# case -> this tree's overrides where they differ from base's (the spelling at ff14338): the
# one gated skip's layers became a pair of the list model.residual.skips
# fmt: off
NOW: dict[str, list[str]] = {
    "C": respelled(CASES["C"]["base"], {
        "model.residual.skip_from": ["model.residual.skips=[[1,2]]"],
        "model.residual.skip_to": []}),
}
# fmt: on


def overrides(case: str, side: str, ranks: int) -> list[str]:
    own = NOW.get(case, CASES[case]["base"]) if side == "now" else CASES[case]["base"]
    return [*COMMON, *own, f"dist.nproc={ranks}"]


def run(tree: Path, case: str, side: str, ranks: int, out: Path) -> Path:
    """Train the case in `tree` into `out` (reused when it finished before); its final save."""
    done = out / "checkpoints" / "latest"
    if not done.exists():
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "train.py", *overrides(case, side, ranks), f"hydra.run.dir={out}"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-25:])
            raise SystemExit(f"bitwise: {case} on {ranks} rank(s) failed in {tree}:\n{tail}")
    return out / "checkpoints" / done.read_text().strip()


def flatten(obj, prefix: str = "") -> dict:
    """Every tensor and plain value of a nested state, by its path."""
    import torch

    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, list | tuple):
        items = enumerate(obj)
    else:
        return {prefix: obj.detach().cpu() if isinstance(obj, torch.Tensor) else obj}
    out = {}
    for key, value in items:
        out.update(flatten(value, f"{prefix}/{key}" if prefix else str(key)))
    return out


def same(a, b) -> bool:
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        # bytes, not values: -0.0 against 0.0 and NaN payloads count as differences
        return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                           b.contiguous().view(-1).view(torch.uint8))  # fmt: skip
    return a == b


def compare(base: Path, now: Path) -> list[str]:
    """What differs between two saves: the base read through this tree's upgrade."""
    import torch

    from trainer.checkpoint.upgrade import upgrade_parts

    def parts(path: Path) -> dict:
        loaded = {p: torch.load(path / f"{p}.pt", map_location="cpu", weights_only=False)
                  for p in ("model", "optimizers")}  # fmt: skip
        meta = json.loads((path / "meta.json").read_text())
        return loaded, meta

    (b, b_meta), (n, _) = parts(base), parts(now)
    b = upgrade_parts(b, b_meta)
    fb, fn = flatten(by_name(b)), flatten(by_name(n))
    diffs = [f"only in {base.parent.parent.name}: {k}" for k in sorted(fb.keys() - fn.keys())]
    diffs += [f"only in this tree: {k}" for k in sorted(fn.keys() - fb.keys())]
    diffs += [f"differs: {k}" for k in sorted(fb.keys() & fn.keys()) if not same(fb[k], fn[k])]
    return diffs


def by_name(parts: dict) -> dict:
    """The parts with each optimizer's state keyed by its parameters' names, not by their
    places: a param group's order follows the module tree, which a layout may change."""
    out = {"model": parts["model"], "optimizers": []}
    for sd in parts["optimizers"]:
        named, groups = {}, []
        for group in sd["param_groups"]:
            names = group.get("param_names") or [str(i) for i in group["params"]]
            for i, name in zip(group["params"], names, strict=True):
                named[f"{group.get('name')}/{name}"] = sd["state"].get(i, {})
            groups.append({k: v for k, v in group.items() if k not in ("params", "param_names")}
                          | {"param_names": sorted(names)})  # fmt: skip
        out["optimizers"].append({"state": named, "param_groups": groups})
    return out


def losses(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r.get("step"), r.get("train_loss"), r.get("val_loss")) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the commit to compare with")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--work", default="/tmp/bitwise", help="worktrees and runs, kept")
    args = parser.parse_args()
    work = Path(args.work)
    commit = subprocess.run(["git", "rev-parse", args.against], cwd=REPO, check=True,
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    base_tree = work / f"tree-{commit[:12]}"
    if not base_tree.exists():
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), commit],
                       cwd=REPO, check=True, capture_output=True)  # fmt: skip
    now_runs = work / f"now-{os.getpid()}"  # this tree changes between calls: rerun it
    failed = 0
    for case in args.cases.split(","):
        for ranks in (int(r) for r in args.ranks.split(",")):
            name = f"{case}-{ranks}"
            base = run(base_tree, case, "base", ranks, work / f"runs-{commit[:12]}" / name)
            now = run(REPO, case, "now", ranks, now_runs / name)
            diffs = compare(base, now)
            if losses(base.parent.parent) != losses(now.parent.parent):
                diffs.append("the logged losses differ")
            failed += bool(diffs)
            verdict = "bitwise equal" if not diffs else f"{len(diffs)} differences"
            print(f"{name:10s} {verdict}", flush=True)
            for d in diffs[:8]:
                print(f"    {d}")
    shutil.rmtree(now_runs, ignore_errors=True)
    print(f"against {commit[:12]}: {'all equal' if not failed else f'{failed} case(s) differ'}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
