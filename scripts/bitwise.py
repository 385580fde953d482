"""Do two commits compute the same thing? Train the default run and every record preset at toy
size, on 1 and 2 ranks, in this tree and in another commit's, and compare the final checkpoints
bit for bit (every parameter, buffer and optimizer tensor) and the logged losses.

    python scripts/bitwise.py --against 9f9de07                  # every case, 1 and 2 ranks
    python scripts/bitwise.py --against HEAD~1 --cases record_2026_07_17 --ranks 1

This tree runs each case with `size=toy`; the other commit runs the same config spelled out
key by key, so it needs this tree's key names (a key renamed since would be refused there).

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
# Each case: a preset at its toy size (`size=toy`, conf/size/), fewer steps where its toy's
# would add nothing; the other commit runs the same config spelled out key by key
# (`spelled_out`), so a commit from before the size overlays compares too.
CASES: dict[str, list[str]] = {
    "default": ["size=toy", "train.steps=4", "train.val_every=4", "train.seq_len=128"],
    "record_2024_11_06": ["experiment=record_2024_11_06", "size=toy", "train.steps=4",
                          "train.val_every=4"],
    "record_2025_01_26": ["experiment=record_2025_01_26", "size=toy", "train.steps=4",
                          "train.val_every=4"],
    "record_2025_11_29": ["experiment=record_2025_11_29", "size=toy"],
    "record_2026_07_17": ["experiment=record_2026_07_17", "size=toy"],
    "record_medium_2025_12_31": ["experiment=record_medium_2025_12_31", "size=toy"],
}  # fmt: skip
SIZE_GROUPS = ("size", "preset_size")


def spelled_out(overrides: list[str]) -> list[str]:
    """`overrides` without the size: its groups and every key it changes, as this tree composes
    them (the groups it selects, then `key=value` for each value that differs)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf, open_dict

    from trainer.config import register_configs, to_config

    def composed(words: list[str]) -> tuple[dict, dict]:
        """The groups chosen, and the config as the trainer reads it (stage columns applied,
        interpolations resolved: what the other commit must be given)."""
        with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
            cfg = compose(config_name="config", overrides=[*words, "run_dir=."],
                          return_hydra_config=True)  # fmt: skip
        choices = dict(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        return choices, OmegaConf.to_container(OmegaConf.structured(to_config(cfg)))

    register_configs()
    plain = [w for w in overrides if w.split("=")[0] not in SIZE_GROUPS]
    choices, sized = composed(overrides)
    before, _ = composed(plain)
    groups = [f"{g}={c}" for g, c in choices.items()
              if g.split("@")[0] not in SIZE_GROUPS and c != before.get(g)]  # fmt: skip
    _, full = composed([*plain, *groups])
    return [*plain, *groups, *_differences(full, sized, "")]


def _differences(full, sized, key: str) -> list[str]:
    if isinstance(full, dict) and isinstance(sized, dict):
        gone = [f"~{key}.{k}".replace("~.", "~") for k in full.keys() - sized.keys()]
        return gone + [
            word
            for k, v in sized.items()
            for word in (_differences(full[k], v, f"{key}.{k}".lstrip("."))
                         if k in full else [f"+{key}.{k}={_value(v)}".replace("+.", "+")])
        ]  # fmt: skip
    rows = all(isinstance(x, dict) for x in [*full, *sized]) if isinstance(full, list) else False
    # a list of rows by index (train.stages.rows.0.seq_len); any other list whole
    if rows and isinstance(sized, list) and len(full) == len(sized):
        return [
            w
            for i, (a, b) in enumerate(zip(full, sized, strict=True))
            for w in _differences(a, b, f"{key}.{i}")
        ]
    return [] if full == sized else [f"{key}={_value(sized)}"]


def _value(v) -> str:
    """A value in Hydra's override grammar."""
    if isinstance(v, dict):
        return "{" + ",".join(f"{k}:{_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_value(x) for x in v) + "]"
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, int | float):
        return repr(v)
    return "'" + str(v).replace("\\", "\\\\").replace("'", "\\'") + "'"


def overrides(case: str, side: str, ranks: int) -> list[str]:
    own = [*COMMON, *CASES[case]]
    return [*(own if side == "now" else spelled_out(own)), f"dist.nproc={ranks}"]


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
