"""The small pieces every block uses: RMSNorm, linear layers, the ReLU² MLP."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.config import ModelConfig
from model.config.param_optim import ParamOptim
from model.mlp_fp8 import FP8Mlp


def rms_norm(x: Tensor) -> Tensor:
    """x / √(mean(x²) + ε) over the last dim, ε = fp32 machine epsilon (computed in fp32 for
    bf16 inputs, returned in their dtype). No learnable gain: the records found it unnecessary,
    and it keeps AdamW's scalar group free for parameters that matter."""
    return F.rms_norm(x, (x.size(-1),))


class CastedLinear(nn.Linear):
    """y = x · bf16(W)ᵀ for bf16 x: the fp32 master weight is cast to the input's dtype in
    forward, so a bf16 model runs bf16 matmuls without autocast (model.numerics.dtype=bf16)."""

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight.to(x.dtype))


def declare(
    p: nn.Parameter, role: str, settings: ParamOptim | None = None, stack_of: str = ""
) -> None:
    """Set on parameter `p` what the optimizer needs to know of it: its `role` ("matrix",
    "embed", "head" or "scalar": which group takes it, optim/partition.py), when its part's
    section gives them its own Adam settings (`optim_settings`, optim/adam_table.py), and for
    a stack of matrices what its leading index runs over (`stack_of`, optim/muon/stacks.py)."""
    p.role = role  # type: ignore[attr-defined]
    if stack_of:
        p.stack_of = stack_of  # type: ignore[attr-defined]
    if settings is not None:
        p.optim_settings = settings  # type: ignore[attr-defined]


def linear(cfg: ModelConfig, fan_in: int, fan_out: int) -> nn.Linear:
    """A bias-free linear layer of the model's kind (`CastedLinear` when
    model.numerics.dtype=bf16)."""
    cls = CastedLinear if cfg.numerics.dtype == "bf16" else nn.Linear
    return cls(fan_in, fan_out, bias=False)


class InOutLinear(nn.Module):
    """y = x · W with W stored (in, out), as the 2025-11 record stores its MLP's C_fc: the
    stored shape decides which axis NorMuon normalises (model.mlp.fc_in_out). The weight is cast
    to the input's dtype, as `CastedLinear`'s."""

    def __init__(self, fan_in: int, fan_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(fan_in, fan_out))

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.to(x.dtype)


class MLP(nn.Module):
    """proj(relu(fc(x))²): 4× wide, ReLU²; with model.mlp.fp8 its training forwards in FP8
    (model/mlp_fp8.py)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        d = cfg.n_embd
        self.fc = InOutLinear(d, 4 * d) if cfg.mlp.fc_in_out else linear(cfg, d, 4 * d)
        proj_in_out = cfg.mlp.proj_in_out
        self.proj = InOutLinear(4 * d, d) if proj_in_out else linear(cfg, 4 * d, d)
        # a plain attribute: no parameters, no buffers
        self.fp8 = FP8Mlp(cfg.mlp) if cfg.mlp.fp8 != "off" else None

    def forward(self, x: Tensor, micro_steps: int = 1) -> Tensor:
        """`micro_steps`: the updates' gradient accumulation (the FP8 state's slots)."""
        if self.fp8 is not None and self.training and torch.is_grad_enabled():
            return self.fp8(self.fc.weight, self.proj.weight, x, micro_steps)
        return self.proj(F.relu(self.fc(x)).square())

    def matrices(self) -> list[nn.Parameter]:
        """fc's and proj's weights (model.numerics.bf16_matrices casts them)."""
        return [self.fc.weight, self.proj.weight]
