"""The record presets compile to one static training graph, as the records do.

At toy size on CPU, through the real config, model, optimizer and `compile_model` (the call
train.py makes), with a backend that records every graph dynamo hands it: a validation
forward at its own length first (as step 0 does), then training steps whose window grows and
whose document boundaries move. The training graph must have static shapes (no symbolic
sizes: with torch's default `dynamic=None` the second length would make them symbolic),
`GPT.forward` must trace without a graph break, and nothing may recompile after the first
training step.
"""

import pytest
import torch
from torch._dynamo.utils import counters

from data.tokenizer import EOT
from model import GPT
from optim import build_optimizer
from tests.helpers import compose_config
from trainer.config import to_config
from trainer.forward import forward_backward
from trainer.launch.compile import CompileCounts, compile_model, reset_compile_state
from trainer.runtime import init_runtime
from trainer.schedule import Schedule

TOY = ["size=toy", "model.head.loss=plain", "run_dir=."]  # each preset's toy (conf/size/)


class Recorder:
    """A torch.compile backend that keeps each graph's input shapes and runs it eagerly."""

    def __init__(self) -> None:
        self.graphs: list[list] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> object:
        self.graphs.append([_shape(x) for x in example_inputs])
        return gm.forward


def _shape(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    return x


def _is_static(shapes: list) -> bool:
    """No symbolic size anywhere: neither a SymInt input nor a SymInt dimension."""
    flat = [d for s in shapes for d in (s if isinstance(s, tuple) else (s,))]
    return not any(isinstance(d, torch.SymInt) for d in flat)


def batch(seq_len: int, rows: int, doc_every: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens with an EOT every `doc_every` tokens (shifted by `seed`)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, EOT, (rows * seq_len + 1,), generator=g)
    tokens[seed % doc_every :: doc_every] = EOT
    return tokens[:-1].view(rows, seq_len), tokens[1:].view(rows, seq_len)


@pytest.mark.parametrize(
    ("record", "impl"),
    [("record_2024_11_06", "auto"), ("record_2025_01_26", "flex"), ("record_2025_01_26", "sdpa")],
)
def test_one_static_training_graph_without_breaks_or_recompiles(record: str, impl: str) -> None:
    """impl=flex is the CUDA path: block masks built in the graph, FlexAttention. It has no
    backward on a CPU, so its training-mode forwards run without gradients here; sdpa (the
    dense masks) and record_2024_11_06's causal attention run whole steps."""
    overrides = [f"experiment={record}", *TOY, f"model.attention.impl={impl}"]
    conf = to_config(compose_config(overrides))
    t = conf.train
    rt = init_runtime("cpu", t.autocast)
    torch.manual_seed(0)
    model = GPT(conf.model, conf.train.stages)
    model.micro_steps = 2
    opt = build_optimizer(model, conf.optim, device=rt.device)
    schedule = Schedule.for_run(t, conf.optim, conf.model)
    reset_compile_state()
    recorder = Recorder()
    compiled = compile_model(model, recorder)
    window = schedule.model_args
    # Step 0's validation first, at its own (longer) length, in eval mode.
    model.eval()
    with torch.no_grad(), rt.autocast():
        compiled(*batch(t.val_seq_len or t.seq_len, 1, 300, 0), **_tensors(window(0)))
    model.train()
    step = _forward_only if impl == "flex" else forward_backward
    step(compiled, batch(t.seq_len, 2, 200, 1), rt, 2, None, _tensors(window(0)))
    after_first = CompileCounts.now()
    train_graph = recorder.graphs[-1]
    # More steps: the window grows (record_2025_01_26 crosses several block counts; the toy window
    # block is the preset's 128 on a 512-token sequence) and documents move.
    for k, s in enumerate((1, t.steps // 3, t.steps // 2, t.steps - 1)):
        opt.set_step(schedule.at(s).optim)
        x, y = batch(t.seq_len, 2, 97 + 50 * k, k + 2)
        step(compiled, (x, y), rt, 2, None, _tensors(window(s)))
        opt.step()
        opt.zero_grad()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert (CompileCounts.now() - after_first).graphs == 0, "recompiled after the first step"
    assert len(recorder.graphs) == 2  # validation (eval) and training: one graph each
    assert _is_static(train_graph), train_graph
    assert any(t.seq_len in s for s in train_graph if isinstance(s, tuple))
    reset_compile_state()


def _forward_only(model, batch, rt, accum_steps, no_sync, model_args) -> None:
    """Training-mode forwards of each micro-batch, without gradients."""
    with torch.no_grad(), rt.autocast():
        for x, y in zip(batch[0].chunk(accum_steps), batch[1].chunk(accum_steps), strict=True):
            model(x, y, **model_args)


def _tensors(args: dict) -> dict:
    return {k: torch.tensor(v, dtype=torch.float64) for k, v in args.items()}
