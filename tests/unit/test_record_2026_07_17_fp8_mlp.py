"""record_2026_07_17's FP8 MLP (docs/records.md D.1 "FP8 MLP", model.mlp.fp8): the training
forward's casts and scales against the formula written with torch's own float8 dtypes, the
delayed scales over steps (bootstrap, micro-step slots), evaluation leaving them alone, the
bf16 backward in float64, and the scales through a checkpoint and a change of world size."""

import logging
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model import GPT, ModelConfig, mlp_fp8
from model.config import update
from model.layers import MLP
from trainer.checkpoint import files
from trainer.checkpoint.state import restore_trainer, trainer_state
from trainer.observe.progress import Progress
from trainer.runtime import Runtime

E4M3, BF16, F64 = torch.float8_e4m3fn, torch.bfloat16, torch.float64
D = 32  # width; the MLP is 4D = 128 wide
BASE = ModelConfig(n_layer=2, n_head=2, n_embd=D)
RT = Runtime(0, 1, 0, torch.device("cpu"), None)  # rank 0 of 1


def config(mode: str = "up_down", **mlp) -> ModelConfig:
    changes = {"numerics.dtype": "bf16", "mlp.fp8": mode}
    return update(BASE, changes | {f"mlp.{k}": v for k, v in mlp.items()})


def make_mlp(mode: str = "up_down", seed: int = 0, **mlp) -> MLP:
    torch.manual_seed(seed)
    layer = MLP(config(mode, **mlp))
    with torch.no_grad():  # fp32 masters, cast to bf16 in the forward as the record's
        layer.fc.weight.copy_(torch.randn_like(layer.fc.weight) * 0.2)
        layer.proj.weight.copy_(torch.randn_like(layer.proj.weight) * 0.05)
    return layer


def inputs(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, D, generator=g, dtype=F64)
    return (x / x.square().mean(-1, keepdim=True).sqrt()).to(BF16)  # an RMSNorm'd n


class Spy:
    """Every FP8 product the MLP asks for: (a, b, scale_a, scale_b, result)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple] = []
        real = mlp_fp8.scaled_mm

        def spy(a, b, sa, sb, dtype, use_fast_accum=False):
            out = real(a, b, sa, sb, dtype, use_fast_accum)
            self.calls.append((a, b, sa, sb, out))
            return out

        monkeypatch.setattr(mlp_fp8, "scaled_mm", spy)


def same8(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same FP8 values, bit for bit."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def bf16_scale64(m: torch.Tensor) -> torch.Tensor:
    """bf16(m/448), the division in float64 rounded to fp32 first."""
    return (m.double() / 448).float().to(BF16).double()


def close_bf16(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """`actual` (bf16) is bf16(expected) but for the last bit (the fp32 sums' order), and mostly
    exactly."""
    expected = expected.detach().to(BF16)
    torch.testing.assert_close(actual, expected, rtol=2**-7, atol=1e-30)
    assert (actual == expected).float().mean() > 0.95


CASES = [("up", False, False), ("up", True, False), ("up_down", False, False),
         ("up_down", False, True)]  # fmt: skip


@pytest.mark.parametrize(("mode", "fc_in_out", "proj_in_out"), CASES)
def test_the_training_forward_is_the_formula(
    monkeypatch: pytest.MonkeyPatch, mode: str, fc_in_out: bool, proj_in_out: bool
) -> None:
    layer = make_mlp(mode, fc_in_out=fc_in_out, proj_in_out=proj_in_out)
    spy = Spy(monkeypatch)
    n = inputs(1)
    out = layer(n)
    flat = n.flatten(0, 1)
    c_fc = layer.fc.weight.to(BF16)
    c_fc = c_fc.T if fc_in_out else c_fc  # (4d, d)
    c_proj = layer.proj.weight.to(BF16)  # (d, 4d): the record's (in, out) c_proj, transposed
    c_proj = c_proj.T if proj_in_out else c_proj  # stored (4d, d) as the record's
    # up: current scales, each quotient rounded once by the e4m3 cast
    a = flat.abs().max().double()
    n8 = (flat.double() * 448 / a).float().to(E4M3)
    s_up = bf16_scale64(c_fc.abs().max())
    fc8 = (c_fc.double() / s_up).float().to(E4M3)
    n8_seen, fc8_seen, sa, sb, pre = spy.calls[0]
    assert same8(n8_seen, n8) and same8(fc8_seen.T, fc8)
    assert sa.item() == (a / 448).float().item() and sb.item() == s_up.item()
    close_bf16(pre, (n8.double() @ fc8.double().T) * (a / 448) * s_up)
    post = F.relu(pre).square()  # bf16
    if mode == "up":
        assert len(spy.calls) == 1
        close_bf16(out.flatten(0, 1), post.double() @ c_proj.double().T)
        # negative control: n·448/a rounded to bf16 before the cast is another n₈
        assert not same8((flat * 448 / a.to(BF16)).to(E4M3), n8)
        return
    # down, first forward: s_act = 1, s_w = bf16(max|c_proj|/448) (the bootstrap)
    s_w = bf16_scale64(c_proj.abs().max())
    post8 = post.double().clamp(max=448).float().to(E4M3)
    proj8 = (c_proj.double() / s_w).clamp(-448, 448).float().to(E4M3)
    post8_seen, proj8_seen, s_act, s_w_seen, _ = spy.calls[1]
    assert s_act.item() == 1.0 and s_w_seen.item() == s_w.item()
    assert same8(post8_seen, post8) and same8(proj8_seen.T.contiguous(), proj8)
    close_bf16(out.flatten(0, 1), (post8.double() @ proj8.double().T) * s_w)


def test_the_down_projection_clamps_at_448(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step whose posts outgrow the previous step's 1.8× headroom: post/s_act is clamped to
    448 (a non-saturating e4m3 cast would make it NaN; torch 2.13's CPU cast saturates), as
    is c_proj/s_w."""
    layer = make_mlp(fp8_bootstrap=0)
    layer(inputs(1))
    with torch.no_grad():
        layer.fc.weight.mul_(3)  # the posts grow ~9×
        layer.proj.weight[0, 0] = 1.0  # the largest weight now, and s_w is last step's
    spy = Spy(monkeypatch)
    out = layer(inputs(2))
    (_, _, _, _, pre), (post8_seen, proj8_seen, s_act, s_w, _) = spy.calls
    post = F.relu(pre).square()
    quotient = post.double() / s_act.double()
    assert quotient.max() > 464 and post8_seen.float().max() == 448
    post8 = quotient.float().clamp(max=448).to(E4M3)
    c_proj = layer.proj.weight.to(BF16).double()
    proj8 = (c_proj / s_w.double()).float().clamp(-448, 448).to(E4M3)
    assert (c_proj / s_w.double()).max() > 464 and proj8_seen.float().max() == 448
    assert same8(post8_seen, post8) and same8(proj8_seen.T.contiguous(), proj8)
    close_bf16(out.flatten(0, 1), (post8.double() @ proj8.double().T) * s_act * s_w)


def train_forwards(
    layer: MLP, monkeypatch: pytest.MonkeyPatch, slots: int, steps: int
) -> tuple[list, list, list]:
    """`steps` updates of `slots` micro-steps each; an SGD-like change of both weights after each
    step. Returns each forward's (s_act, s_w), each forward's max post and each step's
    max|bf16(c_proj)|."""
    spy = Spy(monkeypatch)
    scales, post_max, w_max = [], [], []
    for step in range(steps):
        w_max.append(layer.proj.weight.detach().to(BF16).abs().max().double())
        for i in range(slots):
            layer(inputs(10 * step + i), micro_steps=slots).sum().backward()
            pre, (_, _, s_act, s_w, _) = spy.calls[-2][4], spy.calls[-1]
            scales.append((s_act.item(), s_w.item()))
            post_max.append(F.relu(pre).square().max().double())
        with torch.no_grad():
            for p in layer.parameters():
                p -= 0.02 * p.grad.sign() * (1 + step)  # max|c_proj| grows each step
                p.grad = None
    return scales, post_max, w_max


@pytest.mark.parametrize("slots", [1, 2])
def test_the_delayed_scales_step_by_step(monkeypatch: pytest.MonkeyPatch, slots: int) -> None:
    """s_act of micro-step i: 1.8·(max post of micro-step i one update earlier)/448, 1 in the
    first step; s_w: bf16(max|c_proj|/448) now for steps q ≤ B = 2, then 1.12·(max|c_proj|
    one update earlier)/448."""
    layer = make_mlp(fp8_bootstrap=2)
    scales, post_max, w_max = train_forwards(layer, monkeypatch, slots, steps=5)
    for f, (s_act, s_w) in enumerate(scales):
        q = f // slots
        act = 1.0 if q == 0 else 1.8 * post_max[f - slots] / 448
        w = bf16_scale64(w_max[q]) if q <= 2 else 1.12 * w_max[q - 1] / 448
        assert s_act == pytest.approx(float(act), rel=1e-6, abs=0)
        assert s_w == pytest.approx(float(w), rel=1e-6, abs=0)
        # negative controls: the current weights, or the slot's own forward, would be seen
        if q >= 3:
            assert s_w != pytest.approx(float(1.12 * w_max[q] / 448), rel=1e-3)
            assert s_w != pytest.approx(float(bf16_scale64(w_max[q])), rel=1e-3)
        if q == 2:  # the last bootstrap step, not one too early
            assert s_w != pytest.approx(float(1.12 * w_max[q - 1] / 448), rel=1e-3)
        if q >= 1 and slots > 1:  # the previous micro-step is another slot
            assert s_act != pytest.approx(float(1.8 * post_max[f - 1] / 448), rel=1e-3)


def test_evaluation_neither_reads_nor_changes_the_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = make_mlp()
    train_forwards(layer, monkeypatch, slots=1, steps=2)
    spy, before = Spy(monkeypatch), layer.fp8.state.state_dict()
    plain = make_mlp("off")
    plain.load_state_dict(layer.state_dict())
    layer.eval()
    n = inputs(3)
    assert torch.equal(layer(n), plain(n))  # the bf16 MLP, bit for bit
    layer.train()
    with torch.no_grad():  # a training module without grad is an evaluation too
        assert torch.equal(layer(n), plain(n))
    assert not spy.calls
    after = layer.fp8.state.state_dict()
    assert after["forwards"] == before["forwards"] == 2
    assert torch.equal(after["act_max"], before["act_max"])
    assert torch.equal(after["w_max"], before["w_max"])


@pytest.mark.parametrize("mode", ["up", "up_down"])
def test_the_backward_is_bf16_from_the_fp8_activations(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    layer = make_mlp(mode, proj_in_out=mode == "up_down")  # C_proj either way round
    spy = Spy(monkeypatch)
    n = inputs(4).requires_grad_()
    out = layer(n)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(BF16)
    out.backward(g)
    pre = spy.calls[0][4].double()
    post = F.relu(pre.to(BF16)).square().double()  # the forward's bf16 post
    g64, n64 = g.flatten(0, 1).double(), n.detach().flatten(0, 1).double()
    c_fc, c_proj = layer.fc.weight.to(BF16).double(), layer.proj.weight.to(BF16).double()
    in_out = layer.proj.weight.shape[0] > layer.proj.weight.shape[1]  # (4d, d): the record's
    c_proj = c_proj.T if in_out else c_proj  # (d, 4d) below

    def grads(pre: torch.Tensor, post: torch.Tensor) -> list[torch.Tensor]:
        d_post = (g64 @ c_proj).to(BF16).double()  # bf16 products, as the spec's
        d_pre = (2 * d_post * pre.clamp(min=0)).to(BF16).double()
        return [d_pre @ c_fc, d_pre.T @ n64, g64.T @ post]  # ∂n, ∂c_fc, ∂c_proj

    proj_grad = layer.proj.weight.grad.T if in_out else layer.proj.weight.grad
    got = [n.grad.flatten(0, 1), layer.fc.weight.grad, proj_grad]
    assert layer.fc.weight.grad.dtype == torch.float32  # cast back to the masters' dtype
    plain_pre = (n64.to(BF16) @ c_fc.to(BF16).T).double()  # the bf16 MLP's own pre
    wrong = grads(plain_pre, F.relu(plain_pre).square())
    for actual, expected, other in zip(got, grads(pre, post), wrong, strict=True):
        error = (actual.double() - expected).norm() / expected.norm()
        assert error < 2.5e-3, error  # the result's own bf16 rounding: ≤ 2⁻⁹ per element
        # negative control: the gradient of the bf16 MLP's own pre is far off that
        assert (other - expected).norm() / expected.norm() > 10 * error


def trained_model(steps: int, micro_steps: int = 1) -> GPT:
    """A 2-layer model after `steps` SGD-like updates of `micro_steps` forwards each."""
    torch.manual_seed(0)
    model = GPT(config(fp8_bootstrap=1))
    model.micro_steps = micro_steps
    with torch.no_grad():  # zero-initialised matrices would make every product zero
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    idx = torch.randint(0, 50257, (micro_steps, 8), generator=torch.Generator().manual_seed(6))
    for _ in range(steps):
        for row in idx:
            model(row[None], row[None]).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad.sign()
                p.grad = None
    return model


class Loader:
    def state_dict(self) -> dict[str, int]:
        return {"pos": 0}

    def load_state_dict(self, state: dict[str, int]) -> None:
        pass


def test_a_checkpoint_resumes_with_the_same_scales(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Through the trainer's own save and restore (trainer/checkpoint/state.py, files.py)."""
    model = trained_model(steps=3)
    trainer = trainer_state(Progress(step=3), Loader(), RT, model)
    parts = {"model": model.state_dict(), "optimizers": [], "trainer": trainer}
    path = files.save(tmp_path, 3, parts, {"world_size": 1}, keep=1)
    resumed = GPT(config(fp8_bootstrap=1))
    resumed.load_state_dict(files.load(path).parts["model"])
    with caplog.at_level(logging.INFO, logger="train"):
        restore_trainer(files.load(path), Loader(), RT, resumed)
    assert "each slot takes its own" in caplog.text
    saved, back = model.rank_state()["fp8_mlp"], resumed.rank_state()["fp8_mlp"]
    assert saved.keys() == back.keys() == {"0", "1"} and saved["0"]["forwards"] == 3
    for layer in saved:
        assert saved[layer]["forwards"] == back[layer]["forwards"]
        assert torch.equal(saved[layer]["act_max"], back[layer]["act_max"])
        assert torch.equal(saved[layer]["w_max"], back[layer]["w_max"])
    idx = torch.randint(0, 50257, (1, 8), generator=torch.Generator().manual_seed(7))
    assert torch.equal(model(idx, idx), resumed(idx, idx))  # the next step: the same scales
    fresh = GPT(config(fp8_bootstrap=1))
    fresh.load_state_dict(model.state_dict())
    fresh.blocks[0].mlp.fp8.state.reset(1, torch.device("cpu"))  # negative control: bootstrap
    assert not torch.equal(model(idx, idx), fresh(idx, idx))


def test_another_world_size_maps_the_slots() -> None:
    """Saved on 2 ranks × 1 micro-step: on 1 rank × 2 each slot is its own (the same rows of
    the global batch); on 3 ranks × 1, rank 2 takes saved slot 2 mod 2 = 0."""
    saved = []
    for rank in range(2):
        model = trained_model(steps=2)
        for state in mlp_fp8.delayed_states(model.blocks).values():
            state.act_max = torch.tensor([10.0 + rank])  # tell the ranks apart
        saved.append(model.rank_state())
    model = GPT(config(fp8_bootstrap=1))
    model.micro_steps = 2
    note = model.load_rank_state(saved, rank=0, world_size=1)
    assert note == (
        "FP8 MLP delayed scales: each slot takes its own (saved 2 rank(s) × 1 micro-step(s), "
        "now 1 × 2)"
    )
    state = model.blocks[1].mlp.fp8.state
    assert state.act_max.tolist() == [10.0, 11.0] and int(state.forwards) == 2 * 2  # 2 steps
    assert torch.equal(state.w_max, saved[0]["fp8_mlp"]["1"]["w_max"])
    model.micro_steps = 1
    note = model.load_rank_state(saved, rank=2, world_size=3)
    assert "slot v takes saved slot v mod 2" in note and "now 3 × 1" in note
    assert state.act_max.tolist() == [10.0] and int(state.forwards) == 2
    assert "start afresh" in model.load_rank_state([{}, {}], rank=0, world_size=2)
    assert int(state.forwards) == 0 and not state.act_max.any()
    with pytest.raises(ValueError, match="micro-step slots"):  # slots change only on resume
        model.blocks[1].mlp(inputs(0), micro_steps=2)


def test_off_builds_nothing() -> None:
    model = GPT(update(BASE, {"numerics.dtype": "bf16", "mlp.fp8_bootstrap": 3}))
    assert all(b.mlp.fp8 is None for b in model.blocks)
    assert model.rank_state() == {}
    assert model.load_rank_state([], 0, 1) is None
    assert "model_rank" not in trainer_state(Progress(), Loader(), RT, model)
    on = GPT(config("up_down"))
    assert list(on.state_dict()) == list(model.state_dict())  # no parameters, no buffers
    assert not mlp_fp8.delayed_states(GPT(config("up")).blocks)  # current scales keep none


BAD = [
    ({"mlp.fp8": "up"}, r"model\.mlp\.fp8=up needs model\.numerics\.dtype=bf16"),
    ({"mlp.fp8": "down", "numerics.dtype": "bf16"}, r"model\.mlp\.fp8 must be one of"),
    ({"mlp.fp8_act_headroom": 0.0}, r"model\.mlp\.fp8_act_headroom must be positive"),
    ({"mlp.fp8_weight_headroom": -1.0}, r"model\.mlp\.fp8_weight_headroom must be"),
    ({"mlp.fp8_bootstrap": -1}, r"model\.mlp\.fp8_bootstrap must be >= 0"),
]


@pytest.mark.parametrize(("changes", "match"), BAD)
def test_bad_settings_name_their_key(changes: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        update(BASE, changes).validate()
