"""The fused FP8 MLP's two Triton kernels compiled for an H100 (sm_90) on a CPU, at record #89's
shapes, with what a launch there specialises (scripts/gpu_dryrun/kernels.py): each K loop is
pipelined (its operands loaded asynchronously into `num_stages` shared-memory buffers: 3 ×
32 KB) and no register spills to local memory. A kernel that lost either would run at a
fraction of its speed on the GPU and still pass every interpreter test."""

import pytest

pytest.importorskip("triton", reason="compiling for sm_90 needs triton (pip install triton)")

from scripts.gpu_dryrun.kernels import compile_sm90, kernels

MLP = [spec for spec in kernels() if spec["name"] in ("_up_relu2_kernel", "_relu2_grad_kernel")]


@pytest.mark.parametrize("spec", MLP, ids=[spec["name"] for spec in MLP])
def test_the_mlp_kernels_are_pipelined_without_spills(spec: dict) -> None:
    got = compile_sm90(spec)
    assert got["async"] and got["shared"] == 3 * 32 * 1024, got
    assert got["stack"] == 0 and got["registers"] <= 255, got
