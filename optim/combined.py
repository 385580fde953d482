"""One optimizer object for a whole model: Muon and AdamW parts, their schedules, their state.

The loop sees only this object: `schedule(step)` sets every step-dependent value (each
group's LR from its base LR, Muon's momentum), `step()` and `zero_grad()` act on every part,
`lrs()` names each group's current LR for logging, and `state_dict()` / `load_state_dict()`
carry every part's state through a checkpoint. Which parts exist and what they hold is
`optim/build.py`'s business; nothing outside `optim/` needs to know.
"""

from typing import Any

import torch

from optim.muon import Muon
from optim.schedule import Schedules, StepValues


class CombinedOptimizer:
    def __init__(
        self,
        parts: list[torch.optim.Optimizer],
        schedules: Schedules,
        summary: str,
        self_reduced: list[str] | None = None,
    ) -> None:
        """`parts` in a fixed order (a checkpoint lists their states in it); every param
        group carries a unique "name" and its base LR as "initial_lr". `self_reduced`: names
        of the parameters whose gradients a part averages across ranks itself."""
        if not parts:
            raise ValueError("the model has no trainable parameters to optimize")
        self.parts = parts
        self.schedules = schedules
        self.summary = summary
        self.self_reduced = list(self_reduced or [])
        names = [g["name"] for opt in parts for g in opt.param_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"param group names must be unique, got {names}")

    def schedule(self, step: int) -> StepValues:
        """Set every value that depends on the step for update `step` (0-based); return them.

        Each LR is set from the group's base LR, never from the previous step's, so the LR at
        a step does not depend on the run's history (a resumed run follows the same curve).
        """
        values = self.schedules.at(step)
        for opt in self.parts:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * values.lr_mult
                if isinstance(opt, Muon):
                    group["momentum"] = values.muon_momentum
        return values

    def step(self) -> None:
        for opt in self.parts:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)

    def params(self) -> list[torch.Tensor]:
        """Every parameter this object trains."""
        return [p for opt in self.parts for g in opt.param_groups for p in g["params"]]

    def lrs(self) -> dict[str, float]:
        """The current LR of every param group, by group name ("muon", "embed", ...)."""
        return {g["name"]: g["lr"] for opt in self.parts for g in opt.param_groups}

    def state_dict(self) -> list[dict[str, Any]]:
        """Every part's state, in build order. A collective when Muon keeps owner-only momentum
        (exchange=reduce_scatter on several ranks): every rank must call it."""
        return [opt.state_dict() for opt in self.parts]

    def load_state_dict(self, states: list[dict[str, Any]]) -> None:
        """Load momentum and moments from `states`, but keep this run's hyperparameters.

        torch's `load_state_dict` restores the saved param-group settings too; here the
        config governs them (a resumed run may lower an LR on purpose, and flags like AdamW's
        `fused` must fit this run's device). Raises ValueError if the layouts differ.
        """
        if len(states) != len(self.parts):
            raise ValueError(
                f"the saved state has {len(states)} optimizers, this run has {len(self.parts)} "
                f"({self.summary})"
            )
        for opt, state in zip(self.parts, states, strict=True):
            saved = state["param_groups"]
            if len(saved) != len(opt.param_groups):
                raise ValueError(
                    f"the saved {type(opt).__name__} has {len(saved)} parameter groups, this "
                    f"run's has {len(opt.param_groups)}"
                )
            fresh = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            # Settings replaced before loading, so torch places the state (e.g. AdamW's step
            # counters) as this run's flags need.
            groups = [{**old, **new} for old, new in zip(saved, fresh, strict=True)]
            opt.load_state_dict({**state, "param_groups": groups})
