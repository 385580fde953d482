"""model.mlp.fp8_kernel=triton where the model calls it (`FP8Mlp`, record D's FP8 MLP with its
delayed scales): through the fused Triton kernel (Triton's interpreter on a CPU) the output,
the max post the next step's scale takes and every gradient equal the torch path's, and the
key is refused where the kernel cannot run or has nothing to fuse. The kernel itself against
its reference: tests/unit/test_triton_mlp.py."""

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
    calls, kernel = [], triton_mlp.fused_up_relu2
    monkeypatch.setattr(triton_mlp, "fused_up_relu2", lambda *a: calls.append(1) or kernel(*a))
    want = run("torch", in_out)
    assert not calls
    got = run("triton", in_out)
    assert calls == [1, 1], "the key reached the kernel, once a forward"
    for name, a, b in zip(("out", "max post", "∂x", "∂c_fc", "∂c_proj"), want, got, strict=True):
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
        model = GPT(conf.model)
    with pytest.raises(ValueError, match=r"fp8_kernel=triton: .*interpreter"):
        model.check_device(torch.device("cpu"))
    with pytest.raises(ValueError, match=r"needs model\.mlp\.fp8=up_down, not up"):
        MlpConfig(fp8="up", fp8_kernel="triton").validate()
