"""The `optim.muon` settings: their defaults (also `Muon`'s), allowed values and rules."""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optim.exchange import EXCHANGES
from optim.newton_schulz import COEFFICIENT_SETS, NS_DTYPES, NS_FORMS, coefficient_set

MOMENTUM_FORMS = ("ema", "accumulate")

# `sharded_ns`: how ShardedMuon (dist.strategy=fsdp) orthogonalises its dim-0 shards.
SHARDED_NS = ("gather", "tp")

# `lr_scale`: the factor on the LR of a (rows, cols) matrix.
LR_SCALES: dict[str, Callable[[int, int], float]] = {
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),  # Keller Jordan's
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),  # Moonshot's
    "none": lambda rows, cols: 1.0,
}


@dataclass
class MuonConfig:
    """The `optim.muon` settings; their defaults are also `Muon`'s constructor defaults."""

    lr: float = 0.02  # base LR before the shape scale below
    momentum: float = 0.95  # momentum after warmup
    momentum_warmup_start: float = 0.85  # momentum at step 0, raised linearly to `momentum`
    momentum_warmup_steps: int = 300  # steps of that linear warmup; 0 = constant momentum
    nesterov: bool = True  # Nesterov-style lookahead on the momentum buffer
    # ema: buf <- μ·buf + (1−μ)·g, u = (1−μ)·g + μ·buf | accumulate: buf <- μ·buf + g,
    # u = g + μ·buf (the 2024-11 record; the same direction once μ is constant, not during
    # its warmup)
    momentum_form: str = field(default="ema", metadata={"choices": MOMENTUM_FORMS})
    ns_steps: int = 5  # Newton-Schulz iterations (polar_express is retuned for each count)
    # classic: Keller Jordan's quintic | polar_express: per-iteration (optim/newton_schulz.py)
    ns_coefficients: str = field(default="classic", metadata={"choices": COEFFICIENT_SETS})
    # LR factor by shape: original = max(1, rows/cols)**0.5 | match_rms_adamw = 0.2*sqrt(max) | none
    lr_scale: str = field(default="original", metadata={"choices": LR_SCALES})
    # factored: a·X + (b·A + c·A²)·X, each sum fused into its product | factored_unfused: the
    # same with every op separate, the 2025-01 record's order and rounding | expanded: a·X +
    # b·AX + (c·A)·AX, the 2024-11 record's | gram: factored on near-square matrices, the
    # iteration run on the m×m Gram matrix (restarted once) on elongated ones: 20 % fewer
    # FLOPs on GPT-2 small and as close to U·Vᵀ, but ~3× the bf16 rounding of factored, enough
    # to move 1- vs 2-rank curves apart by 2e-3 (optim/newton_schulz.py, scripts/bench_ns.py)
    ns_form: str = field(default="factored", metadata={"choices": NS_FORMS})
    weight_decay: float = 0.0  # decoupled: p *= 1 - lr * weight_decay
    eps: float = 1e-7  # added to the Frobenius norm before normalising
    # Newton–Schulz precision: bf16 | fp32 | auto = bf16 on CUDA and on CPUs with native bf16,
    # fp32 elsewhere (emulated bf16 matmuls are several times slower than fp32)
    ns_dtype: str = field(default="auto", metadata={"choices": NS_DTYPES})
    # How ranks share Newton–Schulz work (optim/exchange.py; one process ignores it):
    # all_gather: each rank sends its own updates (fastest in scripts/bench_dist_muon.py) |
    # all_reduce: updates summed into a zeroed buffer (twice the bytes) | reduce_scatter: Muon
    # gradients skip DDP and go to their owners, updated parameters are gathered (least traffic
    # in all; momentum then lives on the owner and state_dict() is a collective)
    exchange: str = field(default="all_gather", metadata={"choices": EXCHANGES})
    # Newton–Schulz of FSDP-sharded matrices (dist.strategy=fsdp only; optim/sharded_muon.py):
    # gather: each matrix's shards go to one owner rank (all_to_all), which orthogonalises it
    # whole and sends the rows back | tp: tensor-parallel on the row shards in place
    # (optim/tp_newton_schulz.py), an all_reduce of the cols×cols Gram matrix per iteration,
    # no rank ever holds a whole matrix (suits tall matrices; wide ones need the large Gram)
    sharded_ns: str = field(default="gather", metadata={"choices": SHARDED_NS})
    # QK-clip τ (MuonClip, optim/qk_clip.py): after each step, heads whose max attention logit
    # exceeded τ get W_q and W_k scaled by √(τ/max); 0 = off. Costs an extra q·kᵀ per layer.
    # Bounds the logits only with model.qk_norm=false (QK-norm cancels any scale of W_q, W_k)
    qk_clip: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming the `optim.muon.*` key that is wrong."""
        check_settings(vars(self), "optim.muon.")
        if not 0.0 <= self.momentum_warmup_start < 1.0:
            raise ValueError(
                f"optim.muon.momentum_warmup_start must be in [0, 1), got "
                f"{self.momentum_warmup_start}"
            )
        if self.momentum_warmup_steps < 0:
            raise ValueError("optim.muon.momentum_warmup_steps must be >= 0")
        if self.qk_clip < 0:
            raise ValueError(f"optim.muon.qk_clip must be >= 0 (0 = off), got {self.qk_clip}")


def check_settings(settings: Mapping[str, Any], where: str) -> None:
    """Muon's rules for its hyperparameters, for a param group ("Muon ") and for the config
    ("optim.muon."): raise ValueError naming the first bad one, prefixed by `where`."""
    if not settings["lr"] >= 0:
        raise ValueError(f"{where}lr must be >= 0, got {settings['lr']}")
    if not 0 <= settings["momentum"] < 1:
        raise ValueError(f"{where}momentum must be in [0, 1), got {settings['momentum']}")
    steps = settings["ns_steps"]
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"{where}ns_steps must be an integer >= 1, got {steps!r}")
    for key, check in (("ns_coefficients", coefficient_set), ("lr_scale", _lr_scale)):
        try:
            check(settings[key])
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
    for key, allowed in (("momentum_form", MOMENTUM_FORMS), ("ns_form", NS_FORMS)):
        if settings[key] not in allowed:
            raise ValueError(f"{where}{key} must be one of {allowed}, got {settings[key]!r}")
    if not settings["weight_decay"] >= 0:
        raise ValueError(f"{where}weight_decay must be >= 0, got {settings['weight_decay']}")
    if not settings["eps"] > 0:
        raise ValueError(f"{where}eps must be > 0, got {settings['eps']}")


def _lr_scale(name: str) -> Callable[[int, int], float]:
    if name not in LR_SCALES:
        raise ValueError(f"lr_scale must be one of {sorted(LR_SCALES)}, got {name!r}")
    return LR_SCALES[name]


def lr_scale_factor(shape: Sequence[int], lr_scale: str) -> float:
    """The factor multiplying the LR of a matrix of `shape` (rows, cols) under `lr_scale`."""
    rows, cols = shape
    return _lr_scale(lr_scale)(rows, cols)
