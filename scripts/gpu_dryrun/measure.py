"""A preset's ledger per stage on the pretend H100: `python -m scripts.gpu_dryrun --ledger`.

At the first step of each stage (scripts/bench/gpu.py's `window_steps`), the training step
runs once per kind of step, uncounted (every graph compiles), then once per kind counted:
a normal step and, where Adam updates every other step (records #46 and #89), an Adam step.
The counts are rank 0's share at `world` ranks (`gpu.build`'s `LocalView`, wrapped in a
`Wire` that books each collective the optimizer makes, and DDP's all-reduce of the other
gradients, booked to the backward, which DDP's bucketed all-reduce overlaps), or one GPU's
share of the batch with the whole optimizer (world 1, the way scripts/bench/gpu.py measured
before `--world` existed).

`gpu` is the module that builds the preset: this tree's scripts/bench/gpu.py, or an older
commit's (scripts/gpu_dryrun/calibrate.py), whose build takes no `world`.
"""

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from scripts.gpu_dryrun.ledger import (
    Launch,
    Ledger,
    Parts,
    Recorder,
    Wire,
    enable_estimates,
    install,
)


@dataclass
class StepLedger:
    """One counted step: where it stands in the run and what it cost."""

    step: int
    kind: str  # normal | adam
    tokens: int  # per GPU
    ledger: Ledger

    def to_json(self) -> dict:
        return {"step": self.step, "kind": self.kind, "tokens": self.tokens,
                "launches": self.ledger.to_json()}  # fmt: skip


class Kinds:
    """Which kind of step comes next, normal or Adam. The optimizer says (`full_next`,
    `period`); one from before it could (an older commit's, calibrate.py) updates Adam on
    every k-th call (optim.adamw.update_every = k), counted here from its first call."""

    def __init__(self, opt: Any, conf: Any) -> None:
        self.opt, self.calls = opt, 0
        self.every = max(1, int(getattr(conf.optim.adamw, "update_every", 1)))

    def period(self) -> int:
        return self.opt.period() if hasattr(self.opt, "period") else self.every

    def next(self) -> str:
        if hasattr(self.opt, "full_next"):
            return "adam" if self.opt.full_next() else "normal"
        return "adam" if (self.calls + 1) % self.every == 0 else "normal"

    def stepped(self) -> None:
        self.calls += 1


def build(gpu: ModuleType, conf: Any, world: int, recorder: Recorder) -> Any:
    """The preset as `gpu.build` builds it; at world > 1, its LocalView books collectives."""
    if world <= 1:
        return gpu.build(conf)
    view = gpu.LocalView
    gpu.LocalView = lambda w, rank=0: Wire(view(w, rank), recorder)
    try:
        return gpu.build(conf, world)
    finally:
        gpu.LocalView = view


def ddp_bytes(model: Any, opt: Any) -> int:
    """Bytes of the gradients DDP all-reduces at world > 1: those the optimizer does not
    reduce itself (`self_reduced`: under dist.parallelism=ddp_row_shards, all of its own)."""
    own = set(getattr(opt, "self_reduced", None) or [])
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if p.requires_grad and n not in own)  # fmt: skip


def attention_flops(b: Any, model: Any, idx: Any, args: dict) -> float:
    """The forward's attention FLOPs over `idx` by the model's own count (model/flops.py:
    4·d per (query, key) pair each mask lets through; its count is 6·N·tokens + 12·d·P)."""
    from model.flops import matmul_params

    total = float(b.count(idx.to(b.rt.device), **args))
    return (total - 6.0 * matmul_params(model) * idx.numel()) / 3


def with_attention(ledger: Ledger, forward: float) -> Ledger:
    """The ledger with FlexAttention's FLOPs as the model's count says. inductor states a
    flex kernel's FLOPs as if every (query, key) pair were computed; the kernel skips the
    blocks its block mask leaves out (documents, windows), so the stated count can be tens of
    times the work. The flex kernels are the "flex_attention" kernels that state FLOPs (the
    templates; elementwise kernels fused from the same ops state none). Each forward launch
    takes an equal share of `forward`, each backward launch of 2.5 × `forward` (its five
    products to the forward's two)."""
    from dataclasses import replace

    def flex(x: Launch, backward: bool) -> bool:
        name = x.kernel
        return x.source == "inductor" and x.flops > 0 and "flex_attention" in name and (
            ("flex_attention_backward" in name) == backward
        )  # fmt: skip

    out = list(ledger.launches)
    for backward, total in ((False, forward), (True, 2.5 * forward)):
        n = sum(x.launches for x in out if flex(x, backward))
        if n:
            out = [replace(x, flops=total * x.launches / n, part="attention")
                   if flex(x, backward) else x for x in out]  # fmt: skip
    return Ledger(out)


def preset_ledgers(gpu: ModuleType, conf: Any, world: int, stages: int | None,
                   shim: Any) -> list[StepLedger]:  # fmt: skip
    """Each stage's counted steps (`stages`: the first that many; None: all)."""
    enable_estimates()
    recorder = Recorder(Parts(frozenset(), frozenset()), shim)
    remove = install(recorder)
    try:
        b = build(gpu, conf, world, recorder)
        model = getattr(b.fwd, "_orig_mod", b.fwd)
        recorder.parts = Parts.of(model)
        step_opt = b.opt.step

        def optimizer_step(*args: Any, **kwargs: Any) -> Any:
            with recorder.phase("optimizer"):
                return step_opt(*args, **kwargs)

        b.opt.step = optimizer_step
        steps = gpu.window_steps(b)[:stages]
        rng, out = np.random.default_rng(0), []
        kinds = Kinds(b.opt, conf)
        for s in steps:
            args = gpu.model_args(b, s)
            tokens = b.rows * gpu.seq_len(b, s)
            for _ in range(kinds.period()):  # every kind of step compiles
                gpu.train_step(b, s, gpu.random_batch(b.rows, gpu.seq_len(b, s), rng), args)
                kinds.stepped()
            for _ in range(kinds.period()):
                kind = kinds.next()
                batch = gpu.random_batch(b.rows, gpu.seq_len(b, s), rng)
                with recorder.recording():
                    gpu.train_step(b, s, batch, args)
                    if world > 1 and (ddp := ddp_bytes(model, b.opt)):
                        with recorder.phase("backward"):
                            ring = ddp * 2 * (world - 1) / world
                            recorder.book_collective("all_reduce (DDP)", ring)
                ledger = recorder.take()
                attention = attention_flops(b, model, batch[0], args)
                out.append(StepLedger(s, kind, tokens, with_attention(ledger, attention)))
                kinds.stepped()
        return out
    finally:
        remove()
