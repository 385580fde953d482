"""trainer/checkpoint/dcp_state.py in one process (no process group): a dcp save's names,
whole-tensor reads, in-place loads, the missing-tensor error, and a torch_save state into the same
run."""

import warnings
from pathlib import Path

import pytest
import torch

from model import GPT, ModelConfig
from optim import build_optimizer
from optim.config import OptimConfig
from trainer.checkpoint import dcp_state

CFG = ModelConfig(n_layer=1, n_head=2, n_embd=16)


def trained(seed: int) -> tuple[GPT, object]:
    torch.manual_seed(seed)
    model = GPT(CFG)
    opt = build_optimizer(model, OptimConfig(), device=torch.device("cpu"))
    idx = torch.randint(0, 50257, (2, 8))
    for _ in range(2):
        model(idx, idx.roll(-1, 1)).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


@pytest.fixture(autouse=True)
def _quiet() -> None:
    warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")


def test_save_then_read_whole(tmp_path: Path) -> None:
    model, opt = trained(0)
    dcp_state.save_sharded(tmp_path, model, opt)
    weights, state = dcp_state.read_whole(tmp_path)
    assert weights.keys() == model.state_dict().keys()
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert state.keys() == opt.flat_state().keys()
    assert all(torch.equal(state[k], v) for k, v in opt.flat_state().items())
    assert any(k.startswith("muon/") for k in state) and any(k.startswith("embed/") for k in state)


def test_load_in_place_and_the_missing_tensor_error(tmp_path: Path) -> None:
    model, opt = trained(0)
    dcp_state.save_sharded(tmp_path / "a", model, opt)
    other, other_opt = trained(1)
    dcp_state.load_sharded(tmp_path / "a", other, other_opt, {"names": 2})
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(other_opt.flat_state()[k], v) for k, v in opt.flat_state().items())
    bigger = GPT(ModelConfig(n_layer=2, n_head=2, n_embd=16))
    bigger_opt = build_optimizer(bigger, OptimConfig(), device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"lacks \d+ tensors this run needs"):
        dcp_state.load_sharded(tmp_path / "a", bigger, bigger_opt, {"names": 2})


def test_whole_tensors_into_a_run(tmp_path: Path) -> None:
    """A torch_save checkpoint's parts (whole tensors, positional optimizer state) into a run:
    every parameter and state tensor equal afterwards; other parameters are refused."""
    model, opt = trained(0)
    parts = {"model": model.state_dict(), "optimizers": opt.state_dict()}
    other, other_opt = trained(1)
    dcp_state.load_whole_into_sharded(parts, other, other_opt)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(other_opt.flat_state()[k], v) for k, v in opt.flat_state().items())
    with pytest.raises(ValueError, match="saved model's parameters differ"):
        dcp_state.load_whole_into_sharded({**parts, "model": {}}, other, other_opt)
