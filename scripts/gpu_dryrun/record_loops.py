"""A record's own training loop, stepped at each stage's first steps (record_side.py): the
TrainingManager loop of 2026's records (#89's) and the optimizer list of late 2025's (#46's),
each its script's loop body as the script writes it.
"""

import contextlib
import sys
from typing import Any

from scripts.gpu_dryrun.record_standins import Documents


def drive(ns: dict, recorder: Any, docs: Documents, stages: int | None,
          step_ledger: type) -> list:  # fmt: skip
    """The record's loop body at each stage's first steps: s and s + 1 compile, s + 2 and
    s + 3 are counted, the even one a normal step and the odd one an Adam step (the records
    update Adam on odd steps), in that order."""
    loop = TrainingManagerLoop(ns, docs) if "training_manager" in ns else OptimizersLoop(ns, docs)
    out = []
    for s in loop.starts[:stages]:
        loop.step(s)
        loop.step(s + 1)
        for counted in sorted((s + 2, s + 3), key=lambda n: n % 2):
            with recorder.recording():
                tokens = loop.step(counted, recorder)
            kind = "adam" if counted % 2 else "normal"
            out.append(step_ledger(counted, kind, tokens, recorder.take()))
    return out


def _documents(docs: Documents, cum: Any) -> None:
    """The micro-batch's document starts, from the loader's (padded with its last entry)."""
    starts = [int(x) for x in cum.cpu().tolist()]
    docs.cum = starts[: starts.index(max(starts)) + 1]


class TrainingManagerLoop:
    """Records from 2026 on (#89): a TrainingManager schedules the stages and steps the one
    optimizer; its loop body, as the script's training section writes it."""

    def __init__(self, ns: dict, docs: Documents) -> None:
        self.ns, self.docs = ns, docs
        self.tm, self.model = ns["training_manager"], ns["model"]
        self.accum = ns["grad_accum_steps"]
        first = ns["TRAINING_STAGES"][0]
        self.loader = ns["distributed_data_generator"](
            ns["args"].train_files, first.batch_size, first.train_max_seq_len,
            grad_accum_steps=self.accum,
        )  # fmt: skip
        self.starts = [0, *self.tm.get_transition_steps()][: len(ns["TRAINING_STAGES"]) - 1]
        # The record's warm-up evaluates first, which makes its kernels' placeholder argument
        # (a global, set at first use); a training graph cannot set it (dynamo refuses the
        # side effect inside an autograd.Function), so it is made here, as that warm-up would
        kernels = sys.modules.get("triton_kernels")
        if hasattr(kernels, "_get_dummy_f32"):
            kernels._get_dummy_f32(ns["device"])

    def step(self, s: int, recorder: Any = None) -> int:
        tm, tokens = self.tm, 0
        tm.advance_schedule(s)
        for _ in range(self.accum):
            inputs, targets, cum, bigram_inputs, bigram_cpu = self.loader.send(
                tm.train_loader_send_args
            )
            _documents(self.docs, cum)
            tokens += inputs.numel()
            tm.sparse_index_update(s, bigram_cpu)
            loss = self.model(inputs, targets, cum, bigram_inputs, tm.get_forward_args()).sum()
            tm.sparse_index_share(s)
            (loss * self.ns["grad_scale"]).backward()
        with recorder.phase("optimizer") if recorder else contextlib.nullcontext():
            tm.step_optimizers(s)
            self.model.quantize_mlp_fp8(bootstrap_down=(s < 16))
        return tokens


class OptimizersLoop:
    """Records of late 2025 (#46): a list of optimizers (Adam first, then Muon), stepped by
    `step_optimizers`, the window and batch size read from `get_ws` and `get_bs`."""

    def __init__(self, ns: dict, docs: Documents) -> None:
        missing = [k for k in ("optimizers", "step_optimizers", "get_ws", "get_bs", "args")
                   if k not in ns]  # fmt: skip
        if missing:
            raise SystemExit(
                "record_side: this record's script has neither a training_manager nor "
                f"the loop of late 2025 (no {', '.join(missing)}): not a form it knows"
            )
        self.ns, self.docs, self.model = ns, docs, ns["model"]
        self.accum, args = ns["grad_accum_steps"], ns["args"]
        self.bs = ns["get_bs"](0)
        self.loader = ns["distributed_data_generator"](
            args.train_files, self.bs, args.train_max_seq_len, grad_accum_steps=self.accum
        )
        self.ws_long = ns["get_ws"](0)[1]
        self.model.yarn.reset()
        shape = [(ns["get_bs"](s), ns["get_ws"](s)) for s in range(args.num_scheduled_iterations)]
        self.starts = [0, *(s for s in range(1, len(shape)) if shape[s] != shape[s - 1])]

    def step(self, s: int, recorder: Any = None) -> int:
        ns, args, tokens = self.ns, self.ns["args"], 0
        ws_short, ws_long = ns["get_ws"](s)
        if ws_long != self.ws_long:
            self.model.yarn.apply(self.ws_long, ws_long)
            self.ws_long = ws_long
        bs = ns["get_bs"](s)
        send = (bs, args.train_max_seq_len, self.accum) if bs != self.bs else None
        self.bs = bs
        for i in range(self.accum):
            if i == self.accum - 1 and s % 2 == 1:
                ns["optimizers"][0].should_sync = True  # Adam's exchange, on its odd step
            inputs, targets, cum = self.loader.send(send)
            _documents(self.docs, cum)
            tokens += inputs.numel()
            (self.model(inputs, targets, cum, ws_short, ws_long) / self.accum).backward()
        with recorder.phase("optimizer") if recorder else contextlib.nullcontext():
            ns["step_optimizers"](s, ns["optimizers"], self.model)
        return tokens
