"""FlexAttention compiled on its own (model/attend.py, a CUDA model run eagerly): allowed the
graphs record #89 needs, and failing rather than falling back to the uncompiled kernel, which
materialises every score (the eager run's out-of-memory at its second stage). A counting
backend stands in for inductor: the limit and the fallback are dynamo's, whatever compiles."""

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from model.attend import FLEX_RECOMPILES, compiled_alone


def double_sine(x: torch.Tensor) -> torch.Tensor:
    return x.sin() * 2


def test_it_compiles_past_dynamos_default_and_then_fails_loudly() -> None:
    torch._dynamo.reset()
    counted = CompileCounter()
    fn = compiled_alone(double_sine, 12, backend=counted)
    for n in range(1, 13):  # 12 shapes, 12 graphs: past the default limit of 8
        torch.testing.assert_close(fn(torch.ones(n)), double_sine(torch.ones(n)))
    assert counted.frame_count == 12
    with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
        fn(torch.ones(13))  # the 13th would run uncompiled: it fails instead
    torch._dynamo.reset()


def test_the_plain_compile_it_replaces_falls_back_silently() -> None:
    """The failure guarded against: torch.compile's default stops compiling after 8 graphs
    and runs the function uncompiled, with a warning only."""
    torch._dynamo.reset()
    counted = CompileCounter()
    fn = torch.compile(double_sine, dynamic=False, backend=counted)
    for n in range(1, 13):
        fn(torch.ones(n))
    assert counted.frame_count == 8 < 12 <= FLEX_RECOMPILES
    torch._dynamo.reset()
