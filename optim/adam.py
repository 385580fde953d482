"""Adam written out, for the settings torch's AdamW has no switch for (the 2025-11 record's).

For a parameter p with gradient g, at its t-th update (t = 1, 2, ...), with the group's LR η,
betas (β₁, β₂), ε and decoupled weight decay λ:

    m ← β₁·m + (1 − β₁)·g;   v ← β₂·v + (1 − β₂)·g²
    p ← p·(1 − η·λ)
    eps_placement=corrected (torch's AdamW):  p ← p − η/(1 − β₁ᵗ) · m / (√v/√(1 − β₂ᵗ) + ε)
    eps_placement=raw (the 2025-11 record's): p ← p − η·(√(1 − β₂ᵗ)/(1 − β₁ᵗ)) · m / (√v + ε)

The two placements differ only in where ε enters (ε·√(1 − β₂ᵗ) against ε). Besides:

- `state_dtype`: m and v in the parameter's dtype ("param", as torch), in bf16 for every
  parameter ("bf16", as the 2025-11 record's script creates them; its timed run restores them
  through torch's load_state_dict, which casts them to "param") or in fp32 ("fp32", record D's).
  Each in-place operation rounds to the state's dtype, in the order written above.
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
- `rows` (optim/adam_table.py, from `optim.adamw.table`): per parameter, a factor on the
  group's LR, its own betas and a factor `wd_mul` on λ.
- `weight_decay_form="cautious"` (record D's, #50, strict ">" since #53): with the tensor's
  own LR η (group LR × f(s) × its lr_mul, `optim.lr_mul`'s or its row's) and u the step
  above (u = η·(√(1−β₂ᵗ)/(1−β₁ᵗ))·m/(√v+ε) for raw ε),

      M = 1[u ⊙ p > 0];   p ← p − u − λ·wd_mul·η²·M ⊙ p

  evaluated in fp32 (m and v read in fp32 whatever their dtype) from the stored p, left to
  right, and rounded once to p's dtype (a bf16 parameter has no master copy). Where u⊙p = 0
  (p or u zero) nothing decays.

`optim/build.py` uses this class only when a setting differs from torch's AdamW; otherwise
torch's (fused on CUDA) runs, bit for bit as before.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from optim.adam_table import Row
from optim.config import AdamWConfig
from optim.tied import TiedEmbedHead

MOMENT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}  # "param": the parameter's


class Adam(torch.optim.Optimizer):
    """Adam with `optim.adamw`'s settings (see the module docstring)."""

    def __init__(
        self, params: Any, settings: AdamWConfig, rows: dict[str, Row] | None = None
    ) -> None:
        """`rows`: {parameter name: Row} (named parameters' rows; others keep the group's)."""
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
        self.rows: dict[Tensor, Row] = {}
        rows = dict(rows or {})
        for group in self.param_groups:
            for name, p in zip(group.get("param_names", []), group["params"], strict=False):
                if name in rows:
                    self.rows[p] = rows.pop(name)
        if rows:
            raise ValueError(f"Adam rows for parameters it does not hold: {sorted(rows)}")

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded state to the parameter's dtype; the moments and the counters
        are taken again from the saved values in their own dtypes (fp32 moments of a bf16
        parameter would otherwise lose their low bits)."""
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(ids, params, strict=True):
            saved, state = state_dict["state"].get(i, {}), self.state.get(p, {})
            moments = MOMENT_DTYPES.get(self.hp.state_dtype, p.dtype)
            for key, dtype in (("exp_avg", moments), ("exp_avg_sq", moments),
                               ("pending", torch.float32), ("step", torch.float32)):  # fmt: skip
                if key in saved and key in state:
                    state[key] = saved[key].to(state[key].device, dtype, copy=True)

    def _state(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if "exp_avg" not in state:
            dtype = MOMENT_DTYPES.get(self.hp.state_dtype, p.dtype)
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
            self._update(p, g, state, group, self.rows.get(p))
        if tie is not None:
            tie.after(self.state)
        if k > 1:
            for _, _, state, _ in ready:
                state["grad_sum"].zero_()
                state["pending"].zero_()
        return loss

    def _update(self, p: Tensor, g: Tensor, state: dict, group: dict, row: Row | None) -> None:
        state["step"] += 1
        t = int(state["step"])
        beta1, beta2 = group["betas"] if row is None else row.betas
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        lr = group["lr"] * getattr(p, "lr_mul", 1.0)
        decay = group["weight_decay"]
        if row is not None:
            lr, decay = lr * row.lr_mul, decay * row.wd_mul
        bias1, bias2 = 1 - beta1**t, 1 - beta2**t
        if self.hp.weight_decay_form == "cautious":
            wide = torch.promote_types(p.dtype, torch.float32)  # fp32, or float64 in tests
            u = self._step(m.to(wide), v.to(wide), lr, bias1, bias2, group["eps"])
            _cautious(p, u, decay * lr * lr)
            return
        if decay:
            p.mul_(1 - lr * decay)
        if self.hp.eps_placement == "raw":
            step_size = lr * (bias2**0.5 / bias1)
            p.add_(m.div(v.sqrt().add_(group["eps"])).mul_(step_size), alpha=-1.0)
        else:
            denom = (v.sqrt() / bias2**0.5).add_(group["eps"])
            p.addcdiv_(m, denom, value=-lr / bias1)

    def _step(
        self, m: Tensor, v: Tensor, lr: float, bias1: float, bias2: float, eps: float
    ) -> Tensor:
        """u, the Adam step, in the dtype of `m` and `v`."""
        if self.hp.eps_placement == "raw":
            return m.div(v.sqrt().add_(eps)).mul_(lr * (bias2**0.5 / bias1))
        return m.div((v.sqrt() / bias2**0.5).add_(eps)).mul_(lr / bias1)


def _cautious(p: Tensor, u: Tensor, decay: float) -> None:
    """p ← p − u − decay·1[u⊙p > 0]⊙p in fp32 from the stored p, rounded once on store."""
    w = p.to(u.dtype)
    mask = (u * w) > 0  # strict: where u or p is 0 nothing decays (record D, #53)
    p.copy_(w.sub(u).sub_(w * mask * decay))
