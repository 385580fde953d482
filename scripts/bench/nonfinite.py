"""What the non-finite gradient check costs: its time against a training step's.

    python scripts/bench/nonfinite.py [--models tiny gpt2_124m] [--steps 6] [--device cpu]

Each step (the default batch, 8 x 256 tokens, on random tokens) runs the schedule,
forward/backward, the check (`trainer.nonfinite.nonfinite_grads`: one 2-norm over every
gradient, a device-side flag that rides in the step's existing all-reduce, so no host sync of
its own) and the update; the check is timed on its own with a device synchronise around it.
Medians over the steps after the first, in the same process.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from anywhere

from data.synthetic import SyntheticLoader
from scripts.bench.presets import PARTS, hydra_config
from trainer.build import build_run
from trainer.forward import forward_backward
from trainer.nonfinite import nonfinite_grads
from trainer.runtime import init_runtime

MODELS = ("tiny", "gpt2_124m")  # conf/model/


def bench(name: str, steps: int, device: str) -> dict:
    conf = hydra_config([f"model={name}", f"train.device={device}",
                         "train.batch_size=8", "train.seq_len=256", f"train.steps={steps}",
                         "run_dir=."])  # fmt: skip
    rt = init_runtime(device, "auto")
    run = build_run(conf, PARTS, rt, data=False)  # as train.py builds it, on random tokens
    model, opt, schedule = run.fwd, run.optimizer, run.schedule
    loader = SyntheticLoader(8, 256, seed=0)
    step_s, check_s = [], []
    for step in range(steps):
        rt.synchronize()
        t0 = time.perf_counter()
        opt.set_step(schedule.at(step).optim)
        forward_backward(model, loader.next_batch(), rt)
        rt.synchronize()
        t1 = time.perf_counter()
        flag = nonfinite_grads(opt.params())
        rt.synchronize()
        t2 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        rt.synchronize()
        assert flag.item() == 0.0
        check_s.append(t2 - t1)
        step_s.append(time.perf_counter() - t0 - (t2 - t1))
    step_ms = statistics.median(step_s[1:]) * 1000
    check_ms = statistics.median(check_s[1:]) * 1000
    params = sum(p.numel() for p in opt.params()) / 1e6
    return {"model": name, "params": params, "step": step_ms, "check": check_ms, "device": rt}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--device", default="auto")
    args = parser.parse_args()
    print("| model | parameters | step (no check) | check | check / step |")
    print("|---|---|---|---|---|")
    for name in args.models:
        r = bench(name, args.steps, args.device)
        print(
            f"| {name} | {r['params']:.1f}M | {r['step']:.0f} ms | {r['check']:.1f} ms | "
            f"{r['check'] / r['step']:.2%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
