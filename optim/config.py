"""The `optim` config group: which optimizers, their settings, and the LR schedule.

Each part is defined next to the code that implements it (`MuonConfig` in muon_settings.py,
`ScheduleConfig` in schedule.py, the optimizer names in partition.py); this module adds
AdamW's settings and puts the group together.
"""

from dataclasses import dataclass, field

from optim.muon_settings import MuonConfig
from optim.partition import MATRIX_GROUP
from optim.schedule import ScheduleConfig


@dataclass
class AdamWConfig:
    """torch's AdamW with one param group (and LR) per role of parameter."""

    embed_lr: float = 0.3  # token embedding
    head_lr: float = 0.008  # untied LM head
    scalar_lr: float = 0.04  # every 0-D / 1-D parameter (gains, biases, lambdas)
    hidden_lr: float = 0.002  # hidden 2-D matrices, used only when optim.name=adamw
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-10
    weight_decay: float = 0.0

    def validate(self) -> None:
        """Raise ValueError naming the `optim.adamw.*` key that is wrong."""
        for key in ("embed_lr", "head_lr", "scalar_lr", "hidden_lr", "weight_decay"):
            if getattr(self, key) < 0:
                raise ValueError(f"optim.adamw.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ValueError(f"optim.adamw.{key} must be in [0, 1), got {getattr(self, key)}")
        if self.eps <= 0:
            raise ValueError(f"optim.adamw.eps must be > 0, got {self.eps}")


@dataclass
class OptimConfig:
    # muon_adamw: Muon on hidden matrices + AdamW on the rest | adamw: AdamW only
    name: str = field(default="muon_adamw", metadata={"choices": MATRIX_GROUP})
    muon: MuonConfig = field(default_factory=MuonConfig)
    adamw: AdamWConfig = field(default_factory=AdamWConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    # Keep Muon's momentum and AdamW's moments in CPU memory between steps, on the device only
    # for the update (optim/offload.py): saves their device memory, costs two copies a step
    offload: bool = False

    def validate(self, total_steps: int) -> None:
        """Raise ValueError naming the `optim.*` key that is wrong."""
        self.muon.validate()
        self.adamw.validate()
        self.schedule.validate(total_steps)
