"""A parameter's own optimizer settings, declared by the part that builds it.

A mechanism's section (`model.bigram.optim`, say) holds one `ParamOptim` per parameter; the
part sets it on the parameter as `optim_settings` with its `role`, and the optimizer reads
both there (optim/partition.py, optim/adam_table.py). So a mechanism's optimizer settings
travel with its parameters: adding one needs no row in a table of names, and renaming a
parameter cannot leave its settings behind.
"""

import math
from dataclasses import dataclass


@dataclass
class ParamOptim:
    """Adam's settings for one parameter: a factor on its group's LR, its betas (None: the
    group's, optim.adamw.beta1 / beta2) and a factor on the weight decay. The defaults are
    the group's own settings."""

    lr_mul: float = 1.0
    beta1: float | None = None
    beta2: float | None = None
    wd_mul: float = 1.0

    def validate(self, key: str) -> None:
        """Raise ValueError naming `key` (where this sits in the config) and the bad field."""
        if not (math.isfinite(self.lr_mul) and self.lr_mul >= 0):
            raise ValueError(f"{key}.lr_mul must be a finite number >= 0, got {self.lr_mul}")
        if not (math.isfinite(self.wd_mul) and self.wd_mul >= 0):
            raise ValueError(f"{key}.wd_mul must be a finite number >= 0, got {self.wd_mul}")
        for name in ("beta1", "beta2"):
            beta = getattr(self, name)
            if beta is not None and not 0 <= beta < 1:
                raise ValueError(f"{key}.{name} must be in [0, 1) or null, got {beta}")
