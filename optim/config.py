"""Typed configuration of the optimizers and schedules (the `optim` config group)."""

from dataclasses import dataclass, field

NS_COEFFICIENT_SETS = ("classic", "polar_express")
LR_SCALES = ("original", "match_rms_adamw", "none")
NS_DTYPES = ("auto", "bf16", "fp32")
OPTIMIZER_NAMES = ("muon_adamw", "adamw")
MUON_EXCHANGES = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass
class MuonConfig:
    lr: float = 0.02  # base LR before the shape scale below
    momentum: float = 0.95  # momentum after warmup
    momentum_warmup_start: float = 0.85  # momentum at step 0, raised linearly to `momentum`
    momentum_warmup_steps: int = 300  # steps of that linear warmup; 0 = constant momentum
    nesterov: bool = True  # Nesterov-style lookahead on the momentum buffer
    ns_steps: int = 5  # Newton-Schulz iterations (polar_express has 5 tuned steps)
    ns_coefficients: str = "classic"  # classic | polar_express
    # LR factor by shape: original = max(1, rows/cols)**0.5 | match_rms_adamw = 0.2*sqrt(max) | none
    lr_scale: str = "original"
    weight_decay: float = 0.0  # decoupled: p *= 1 - lr * weight_decay
    eps: float = 1e-7  # added to the Frobenius norm before normalising
    # Newton–Schulz precision: bf16 | fp32 | auto = bf16 on CUDA and on CPUs with native bf16,
    # fp32 elsewhere (emulated bf16 matmuls are several times slower than fp32)
    ns_dtype: str = "auto"
    # How ranks share Newton–Schulz work (optim/exchange.py; one process ignores it):
    # all_gather: each rank sends its own updates (fastest in scripts/bench_dist_muon.py) |
    # all_reduce: updates summed into a zeroed buffer (twice the bytes) | reduce_scatter: Muon
    # gradients skip DDP and go to their owners, updated parameters are gathered (least traffic
    # in all; momentum then lives on the owner and state_dict() is a collective)
    exchange: str = "all_gather"


@dataclass
class AdamWConfig:
    embed_lr: float = 0.3  # token embedding
    head_lr: float = 0.008  # untied LM head
    scalar_lr: float = 0.04  # every 0-D / 1-D parameter (gains, biases, lambdas)
    hidden_lr: float = 0.002  # hidden 2-D matrices, used only when optim.name=adamw
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-10
    weight_decay: float = 0.0


@dataclass
class ScheduleConfig:
    warmup_steps: int = 0  # linear warmup from 0 to the full LR
    cooldown_frac: float = 0.4  # last fraction of steps: linear decay to min_lr_frac
    min_lr_frac: float = 0.0  # LR floor at the end, as a fraction of each group's LR


@dataclass
class OptimConfig:
    name: str = "muon_adamw"  # muon_adamw: Muon on hidden matrices + AdamW | adamw: AdamW only
    muon: MuonConfig = field(default_factory=MuonConfig)
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)

    def validate(self, steps: int) -> None:
        """Raise ValueError naming the `optim.*` key that is wrong."""
        if self.name not in OPTIMIZER_NAMES:
            raise ValueError(f"optim.name must be one of {OPTIMIZER_NAMES}, got {self.name!r}")
        m = self.muon
        if m.lr < 0:
            raise ValueError(f"optim.muon.lr must be >= 0, got {m.lr}")
        for key in ("momentum", "momentum_warmup_start"):
            if not 0.0 <= getattr(m, key) < 1.0:
                raise ValueError(f"optim.muon.{key} must be in [0, 1), got {getattr(m, key)}")
        if m.momentum_warmup_steps < 0:
            raise ValueError("optim.muon.momentum_warmup_steps must be >= 0")
        if m.ns_steps < 1:
            raise ValueError(f"optim.muon.ns_steps must be >= 1, got {m.ns_steps}")
        if m.ns_coefficients not in NS_COEFFICIENT_SETS:
            raise ValueError(
                f"optim.muon.ns_coefficients must be one of {NS_COEFFICIENT_SETS}, "
                f"got {m.ns_coefficients!r}"
            )
        if m.lr_scale not in LR_SCALES:
            raise ValueError(f"optim.muon.lr_scale must be one of {LR_SCALES}, got {m.lr_scale!r}")
        if m.ns_dtype not in NS_DTYPES:
            raise ValueError(f"optim.muon.ns_dtype must be one of {NS_DTYPES}, got {m.ns_dtype!r}")
        if m.exchange not in MUON_EXCHANGES:
            raise ValueError(
                f"optim.muon.exchange must be one of {MUON_EXCHANGES}, got {m.exchange!r}"
            )
        if m.weight_decay < 0:
            raise ValueError(f"optim.muon.weight_decay must be >= 0, got {m.weight_decay}")
        if m.eps <= 0:
            raise ValueError(f"optim.muon.eps must be > 0, got {m.eps}")
        a = self.adamw
        for key in ("embed_lr", "head_lr", "scalar_lr", "hidden_lr", "weight_decay"):
            if getattr(a, key) < 0:
                raise ValueError(f"optim.adamw.{key} must be >= 0, got {getattr(a, key)}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(a, key) < 1.0:
                raise ValueError(f"optim.adamw.{key} must be in [0, 1), got {getattr(a, key)}")
        if a.eps <= 0:
            raise ValueError(f"optim.adamw.eps must be > 0, got {a.eps}")
        s = self.schedule
        if s.warmup_steps < 0:
            raise ValueError(f"optim.schedule.warmup_steps must be >= 0, got {s.warmup_steps}")
        if not 0.0 <= s.cooldown_frac <= 1.0:
            raise ValueError(
                f"optim.schedule.cooldown_frac must be in [0, 1], got {s.cooldown_frac}"
            )
        if not 0.0 <= s.min_lr_frac <= 1.0:
            raise ValueError(f"optim.schedule.min_lr_frac must be in [0, 1], got {s.min_lr_frac}")
        cooldown = round(s.cooldown_frac * steps)
        if s.warmup_steps + cooldown > steps:
            raise ValueError(
                f"optim.schedule.warmup_steps ({s.warmup_steps}) + cooldown "
                f"({cooldown} = cooldown_frac * train.steps) exceed train.steps ({steps})"
            )
