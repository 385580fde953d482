"""Adam written out, for the settings torch's AdamW has no switch for (the 2025-11 record's).

For a parameter p with gradient g, at its t-th update (t = 1, 2, ...), with the group's LR η,
betas (β₁, β₂), ε and decoupled weight decay λ:

    m ← β₁·m + (1 − β₁)·g;   v ← β₂·v + (1 − β₂)·g²
    p ← p·(1 − η·λ)
    eps_placement=corrected (torch's AdamW):  p ← p − η/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε)
    eps_placement=raw (the 2025-11 record's): p ← p − η·(√(1 − β₂ᵗ)/(1 − β₁ᵗ)) · m / (√v + ε)

The two placements differ only in where ε enters (ε·√(1 − β₂ᵗ) against ε). Besides:

- `state_dtype`: m and v in the parameter's dtype ("param", as torch) or in bf16 for every
  parameter ("bf16", the record's: its fp32 scalars too). Each in-place operation rounds to
  the state's dtype, in the order written above.
- `update_every` = k: the parameters move on every k-th call of `step()` only, with the *sum*
  of the k gradients since the last update, accumulated in the parameter's dtype (as autograd
  accumulates a gradient that is not cleared). The record runs k = 2: updates on odd steps with
  the gradients of steps s−1 and s. The partial sum is optimizer state ("grad_sum", with the
  number of gradients in it, "pending"), so a checkpoint taken inside a pair resumes exactly
  and the loop clears every gradient every step. A step skipped by the loop (non-finite) adds
  nothing: the pair then spans it.
- A parameter attribute `lr_mul` (set by optim/build.py from `optim.lr_mul`) multiplies its LR.
- `tie` (optim/tied.py, `optim.tie_embed_head_until`): the token table's summed gradient joins
  the head's, the head takes the step and the table follows it, until their split.

`optim/build.py` uses this class only when a setting differs from torch's AdamW; otherwise
torch's (fused on CUDA) runs, bit for bit as before.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from optim.config import AdamWConfig
from optim.tied import TiedEmbedHead


class Adam(torch.optim.Optimizer):
    """Adam with `optim.adamw`'s settings (see the module docstring)."""

    def __init__(self, params: Any, settings: AdamWConfig) -> None:
        settings.validate()
        self.hp = settings
        defaults = {
            "lr": 1e-3,
            "betas": (settings.beta1, settings.beta2),
            "eps": settings.eps,
            "weight_decay": settings.weight_decay,
        }
        super().__init__(params, defaults)
        self.tie: TiedEmbedHead | None = None  # set by optim/tied.py's `attach`

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded state to the parameter's dtype; the moments keep theirs (a bf16
        → fp32 → bf16 round trip is exact) and the counters stay fp32."""
        super().load_state_dict(state_dict)
        for p, state in self.state.items():
            moments = torch.bfloat16 if self.hp.state_dtype == "bf16" else p.dtype
            for key, dtype in (("exp_avg", moments), ("exp_avg_sq", moments),
                               ("pending", torch.float32), ("step", torch.float32)):  # fmt: skip
                if key in state:
                    state[key] = state[key].to(dtype)

    def _state(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if "exp_avg" not in state:
            dtype = torch.bfloat16 if self.hp.state_dtype == "bf16" else p.dtype
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
            if self.hp.update_every > 1:
                state["grad_sum"] = torch.zeros_like(p)
                state["pending"] = torch.zeros((), dtype=torch.float32)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        k = self.hp.update_every
        ready = []  # (p, its gradient or sum, state, group): the updates due at this call
        for group in self.param_groups:
            for p in group["params"]:
                state = self._state(p)
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                if k > 1:
                    state["grad_sum"].add_(g)
                    state["pending"] += 1
                    if int(state["pending"]) < k:
                        continue  # the sum waits for the rest of its k gradients
                    g = state["grad_sum"]
                ready.append((p, g, state, group))
        tie = self.tie  # optim.tie_embed_head_until: E's sum joins W's, E follows W
        for p, g, state, group in ready if tie is None else tie.before(ready, self.state):
            self._update(p, g, state, group, *group["betas"])
        if tie is not None:
            tie.after(self.state)
        if k > 1:
            for _, _, state, _ in ready:
                state["grad_sum"].zero_()
                state["pending"].zero_()
        return loss

    def _update(
        self, p: Tensor, g: Tensor, state: dict, group: dict, beta1: float, beta2: float
    ) -> None:
        state["step"] += 1
        t = int(state["step"])
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        lr = group["lr"] * getattr(p, "lr_mul", 1.0)
        if group["weight_decay"]:
            p.mul_(1 - lr * group["weight_decay"])
        bias1, bias2 = 1 - beta1**t, 1 - beta2**t
        if self.hp.eps_placement == "raw":
            step_size = lr * (bias2**0.5 / bias1)
            p.add_(m.div(v.sqrt().add_(group["eps"])).mul_(step_size), alpha=-1.0)
        else:
            denom = (v.sqrt() / bias2**0.5).add_(group["eps"])
            p.addcdiv_(m, denom, value=-lr / bias1)
