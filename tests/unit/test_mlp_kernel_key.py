"""model.mlp.fp8_kernel=triton where the model calls it (`FP8Mlp`, record_2026_07_17's FP8 MLP with
its delayed scales): through the fused Triton kernel (Triton's interpreter on a CPU) the output, the
max post the next step's scale takes and every gradient equal the torch path's, and the key is
refused where the kernel cannot run or has nothing to fuse. The kernel itself against its reference:
tests/unit/test_triton_mlp.py."""

import pytest
import torch

from model.config import MlpConfig
from model.mlp_fp8 import FP8Mlp

pytest.importorskip("triton", reason="the fused FP8 MLP kernel needs triton (pip install triton)")


def run(kernel: str, in_out: bool) -> tuple[torch.Tensor, ...]:
    """Two training forwards and backwards (the second with the first's delayed scale) of a
    d 64 MLP over 2 × 40 tokens: (out, max post, ∂x, ∂c_fc, ∂c_proj) of the second."""
    cfg = MlpConfig(fp8="up_down", fp8_kernel=kernel, proj_in_out=in_out, fc_in_out=in_out)
    g = torch.Generator().manual_seed(int(in_out))
    fc = (torch.rand(64, 256, generator=g) - 0.5) * 0.4
    proj = (torch.rand(256, 64, generator=g) - 0.5) * 0.1
    fc, proj = (fc, proj) if in_out else (fc.T.contiguous(), proj.T.contiguous())
    fc, proj = fc.bfloat16().requires_grad_(), proj.bfloat16().requires_grad_()
    mlp = FP8Mlp(cfg)
    for _ in range(2):
        x = torch.randn(2, 40, 64, generator=g)
        x = (x / x.pow(2).mean(-1, keepdim=True).sqrt()).bfloat16().requires_grad_()
        fc.grad = proj.grad = None
        out = mlp(fc, proj, x, 1)
        out.float().square().sum().backward()
    return out.detach(), mlp.state.act_max.clone(), x.grad, fc.grad, proj.grad


@pytest.mark.parametrize("in_out", [False, True])
def test_the_mlp_trains_through_the_kernel_as_through_torch(
    monkeypatch: pytest.MonkeyPatch, in_out: bool
) -> None:
    import model.triton_mlp as triton_mlp

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    calls, up, grad = [], triton_mlp.fused_up_relu2, triton_mlp.fused_relu2_grad
    monkeypatch.setattr(triton_mlp, "fused_up_relu2", lambda *a: calls.append("up") or up(*a))
    monkeypatch.setattr(triton_mlp, "fused_relu2_grad", lambda *a: calls.append("grad") or grad(*a))
    want = run("torch", in_out)
    assert not calls
    got = run("triton", in_out)
    assert calls == ["up", "grad"] * 2, "the key reached both kernels, once a step"
    for name, a, b in zip(("out", "max post", "∂x", "∂c_fc", "∂c_proj"), want, got, strict=True):
        assert torch.equal(a, b), name


def test_a_compiled_mlp_calls_the_kernels_in_one_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.compile (fullgraph: a graph break fails) over a training step of the MLP, its
    backward included, calls both kernels as opaque ops, the output, max post and gradients
    equal to eager's through them; a kernel launched from Python would be traced into."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    cfg = MlpConfig(fp8="up_down", fp8_kernel="triton")
    g = torch.Generator().manual_seed(5)
    fc = ((torch.rand(256, 64, generator=g) - 0.5) * 0.4).bfloat16()
    proj = ((torch.rand(64, 256, generator=g) - 0.5) * 0.1).bfloat16()
    x = torch.randn(2, 40, 64, generator=g)
    x = (x / x.pow(2).mean(-1, keepdim=True).sqrt()).bfloat16()
    results = []
    for backend in (None, "aot_eager"):
        mlp = FP8Mlp(cfg)  # registers the ops, as the model does when built
        w_fc, w_proj, inp = (t.clone().requires_grad_() for t in (fc, proj, x))

        def step(w_fc, w_proj, inp, mlp=mlp):
            return mlp(w_fc, w_proj, inp, 1).float().square().sum()

        fn = step if backend is None else torch.compile(step, backend=backend, fullgraph=True)
        loss = fn(w_fc, w_proj, inp)
        loss.backward()
        results.append((loss, mlp.state.act_max, inp.grad, w_fc.grad, w_proj.grad))
    for name, a, b in zip(("loss", "max post", "∂x", "∂c_fc", "∂c_proj"), *results, strict=True):
        assert torch.equal(a, b), name


def test_where_the_kernel_cannot_run_or_has_nothing_to_fuse_the_key_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from model.gpt import GPT
    from tests.helpers import RECORD_89_TOY, compose_config
    from trainer.config import to_config

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    conf = to_config(compose_config([*RECORD_89_TOY, "model.mlp.fp8_kernel=triton"]))
    with torch.device("meta"):
        model = GPT(conf.model, conf.train.stages)
    with pytest.raises(ValueError, match=r"fp8_kernel=triton: .*interpreter"):
        model.check_device(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"needs model\.mlp\.fp8=up_down, not up"):
        MlpConfig(fp8="up", fp8_kernel="triton").validate()
