"""Varlen attention (model.attention.impl=varlen, model/varlen.py) on a CPU, where torch has no
varlen kernel: the segments it is handed, against the dense mask of model/masks.py's rule (the
reference), and the model's forward through a stand-in kernel with the kernel's documented rule
(`emulated_varlen_attn`), against impl=sdpa. What waits for a GPU: the real kernel's outputs
and gradients against FlexAttention's, and its speed (scripts/bench/attention.py)."""

import pytest
import torch

import model.varlen as varlen
from model.config.kernel_step import KernelStep
from model.forward_schedule import forward_args
from model.gpt import GPT
from model.masks import EOT, _doubled, dense_mask, document_ids
from model.varlen import emulated_varlen_attn, segment_bounds, segments_mask
from tests.helpers import RECORD_89_TOY, compose_config
from trainer.config import Config, to_config
from trainer.train_step import filled

TOY = RECORD_89_TOY


def block_diagonal(masks: torch.Tensor) -> torch.Tensor:
    """(B, T, T) per-row masks as one (B·T, B·T) mask: no row attends to another."""
    return torch.block_diag(*masks)


def tokens(B: int, T: int, seed: int) -> torch.Tensor:
    """Random tokens with EOTs at random places, at a row's start and two in a row."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 1000, (B, T), generator=g)
    idx[torch.rand(B, T, generator=g) < 0.08] = EOT
    idx[0, 0] = EOT
    idx[-1, T // 2 : T // 2 + 2] = EOT
    return idx


@pytest.mark.parametrize("window", [-1, 0, 3, 17])
@pytest.mark.parametrize("document", [True, False])
def test_the_segments_are_the_document_rule(window: int, document: bool) -> None:
    """The kernel's rule over segment_bounds' cu_seqlens equals the dense mask row by row,
    over T positions and over the paired layers' 2T, with room to spare in cu_seqlens."""
    B, T = 3, 40
    idx = tokens(B, T, seed=window + 10 * document)
    docs = document_ids(idx) if document else None
    n = None if window < 0 else torch.tensor(window)
    cu = segment_bounds(idx, document, capacity=64)
    assert cu.shape == (65,) and cu.dtype == torch.int32 and int(cu[-1]) == B * T
    want = dense_mask(docs, T, n, 16, idx.device, token_window=True)[:, 0].expand(B, T, T)
    assert torch.equal(segments_mask(cu, B * T, window), block_diagonal(want))
    paired = dense_mask(_doubled(docs), 2 * T, n, 16, idx.device, token_window=True)[:, 0]
    paired = paired.expand(B, 2 * T, 2 * T)
    assert torch.equal(segments_mask(cu * 2, 2 * B * T, window), block_diagonal(paired))


def test_a_full_cu_seqlens_holds_and_one_segment_more_fails() -> None:
    """Exactly `capacity` segments fill cu_seqlens; one more fails instead of merging two
    documents (on a CPU the device assert raises at once)."""
    idx = tokens(2, 32, seed=1)
    count = int((idx == EOT).sum()) + int((idx[:, 0] != EOT).sum())
    cu = segment_bounds(idx, True, capacity=count)
    assert int(cu[-2]) < 64 and (cu[1:] > cu[:-1]).all()
    with pytest.raises(RuntimeError, match=r"max_pieces or model\.attention\.max_segments"):
        segment_bounds(idx, True, capacity=count - 1)


def toy_config(impl: str) -> Config:
    return to_config(compose_config([*TOY, f"model.attention.impl={impl}"]))


def toy(impl: str) -> GPT:
    conf = toy_config(impl)
    torch.manual_seed(0)
    return GPT(conf.model, conf.train.stages)


def step_args(model: GPT, step: int) -> dict:
    """The forward's arguments at `step` as the run's schedule gives them (the toy's table)."""
    args = forward_args(model.cfg, toy_config("varlen").train.stages, step, 1390)
    cpu = torch.device("cpu")
    return {k: v if isinstance(v, KernelStep) else filled(v, cpu) for k, v in args.items()}


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(varlen, "varlen_kernel", lambda: emulated_varlen_attn)


@pytest.mark.parametrize("step", [0, 1000])
def test_record_89s_toy_through_the_kernel_equals_sdpa(stand_in: None, step: int) -> None:
    """One packed row as the record's: the loss and every gradient in training, the logits
    in evaluation, bit for bit (stage 1 and stage 3, YaRN's third scale). SDPA is handed the
    stage's scale as a float, as the kernel is (with YaRN's tensor it scales q first, one
    rounding more, model/attend.py)."""
    dense, flash = toy("sdpa"), toy("varlen")
    flash.load_state_dict(dense.state_dict())
    args = step_args(flash, step)
    dense.yarn_scales = None
    dense.cfg.attention.scale = flash.yarn_scale_list[args["kernel_step"].yarn_stage]
    assert args["kernel_step"].row_segments == (63 if step == 0 else 127)
    idx = tokens(1, 128, seed=step)
    y = torch.roll(idx, -1, 1)
    losses = []
    for model in (dense, flash):
        loss = model(idx, y, **args)
        loss.backward()
        losses.append(loss.detach())
    assert torch.equal(losses[0], losses[1])
    for (name, a), b in zip(dense.named_parameters(), flash.parameters(), strict=True):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad), name
    dense.eval(), flash.eval()
    with torch.no_grad():
        assert torch.equal(dense(idx, **args), flash(idx, **args))


def test_several_rows_are_separate_segments(stand_in: None) -> None:
    """Two rows read as one sequence attend as two rows: equal to SDPA's (B, H, T, T) up to
    the rounding of other matmul shapes."""
    dense, flash = toy("sdpa"), toy("varlen")
    flash.load_state_dict(dense.state_dict())
    dense.eval(), flash.eval()
    idx, args = tokens(2, 96, seed=5), step_args(flash, 0)
    with torch.no_grad():
        torch.testing.assert_close(flash(idx, **args), dense(idx, **args), rtol=2e-2, atol=2e-2)


def test_the_stage_table_sizes_the_kernel_step() -> None:
    """Training steps take the stage's max_pieces and max_piece_len, the windows of the
    stage in whole tokens and its YaRN stage (record #89: 63 / 95 / 127 pieces; its toy caps
    pieces at 32, 128 and 128 tokens)."""
    conf = toy_config("varlen")
    cfg, table = conf.model, conf.train.stages
    steps = [table.start(k, 1390) for k in range(3)] + [1389]
    got = [forward_args(cfg, table, s, 1390)["kernel_step"] for s in steps]
    assert [k.row_segments for k in got] == [63, 95, 127, 127]
    assert [k.max_len for k in got] == [32, 128, 128, 128]  # the toy's caps (size=toy)
    floats = [forward_args(cfg, table, s, 1390) for s in steps]
    assert [k.long for k in got] == [int(a["window_tokens"]) for a in floats]
    assert [k.short for k in got] == [int(a["short_window_tokens"]) for a in floats]
    assert [k.yarn_stage for k in got] == [int(a["yarn_stage"]) for a in floats] == [0, 1, 2, 2]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model.attention.window_granularity=block"], "whole-block windows"),
        (["model.attention.max_segments=0"], "max_segments must be >= 1"),
    ],
)
def test_what_varlen_cannot_do_fails_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        to_config(compose_config([*TOY, "model.attention.impl=varlen", *overrides]))


def test_a_growing_window_is_refused() -> None:
    with pytest.raises(ValueError, match="window_tokens"):
        to_config(compose_config([
            "model.attention.impl=varlen", "model.attention.window=LS",
            "model.attention.window_tokens=256", "model.attention.window_granularity=token",
            "run_dir=.",
        ]))  # fmt: skip


def test_a_cpu_run_and_qk_clip_are_refused_before_the_first_step() -> None:
    model = toy("varlen")
    with pytest.raises(ValueError, match=r"impl=varlen: it runs on CUDA only.*impl=auto"):
        model.check_device(torch.device("cpu"))
    attention = next(b.attn for b in model.blocks if b.attn is not None and not b.attn.paired)
    with pytest.raises(ValueError, match=r"qk_clip.*impl=varlen"):
        attention.track_max_logit = True


@torch.library.custom_op("tests_varlen::attend", mutates_args=())
def _opaque(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
    scale: float, left: int,
) -> torch.Tensor:  # fmt: skip
    window = (left, 0)
    return emulated_varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, window_size=window)


TRACED: list = []  # (max_len, scale, left) as each trace saw them


@_opaque.register_fake
def _(q, k, v, cu, max_len, scale, left):
    TRACED.append((max_len, scale, left))
    return torch.empty_like(q)


def test_a_compiled_model_compiles_once_per_kernel_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's Python numbers reach it as constants (no SymInt), so a compiled model
    (dynamic=False, as trainer/launch/compile.py compiles) compiles once per distinct step
    and reuses it: a stand-in kernel opaque to the compiler, as torch's custom op is."""

    def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, scale, window_size):
        return _opaque(q, k, v, cu_q, max_q, scale, window_size[0])

    monkeypatch.setattr(varlen, "varlen_kernel", lambda: kernel)
    TRACED.clear()
    model = toy("varlen")
    graphs = []

    def backend(gm: torch.fx.GraphModule, example: list) -> object:
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=False, fullgraph=True)
    idx = tokens(1, 128, seed=0)
    a, b = step_args(model, 0), step_args(model, 1000)
    with torch.no_grad():
        for args in (a, a, b, b, a):
            compiled(idx, torch.roll(idx, -1, 1), **args)
    torch._dynamo.reset()
    assert len(graphs) == 2
    assert TRACED
    assert all(type(m) is int and type(s) is float and type(w) is int for m, s, w in TRACED)
