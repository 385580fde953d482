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
  through torch's load_state_dict, which casts them to "param") or in fp32 ("fp32",
  record_2026_07_17's).
  Each in-place operation rounds to the state's dtype, in the order written above.
- `update_every` = k: the parameters move on every k-th call of `step()` only, with the *sum*
  of the k gradients since the last update, accumulated in the parameter's dtype (as autograd
  accumulates a gradient that is not cleared). The record runs k = 2: updates on odd steps with
  the gradients of steps s−1 and s. The partial sum is optimizer state ("grad_sum", with the
  number of gradients in it, "pending"), so a checkpoint taken inside a pair resumes exactly
  and the loop clears every gradient every step. A step skipped by the loop (non-finite) adds
  nothing: the pair then spans it. Sharded over ranks (`comm`), each rank sums its own
  gradients and the sum is averaged over ranks once, at the update, as the records do (no
  exchange on the steps between); a checkpoint inside a pair then holds every rank's partial
  sum, stacked (`state_dict`), and one resumed on another number of ranks hands rank 0 the
  sum they average to.
- A parameter attribute `lr_mul` (set by optim/build.py from `optim.lr_mul`) multiplies its LR.
- `tie` (optim/tied.py, `optim.tie_embed_head_until`): the token table's summed gradient joins
  the head's, the head takes the step and the table follows it, until their split.
- `rows` (optim/adam_table.py, from `optim.adamw.table`): per parameter, a factor on the
  group's LR, its own betas and a factor `wd_mul` on λ.
- `weight_decay_form="cautious"` (record_2026_07_17's, #50, strict ">" since #53): with the tensor's
  own LR η (group LR × f(s) × its lr_mul, `optim.lr_mul`'s or its row's) and u the step
  above (u = η·(√(1−β₂ᵗ)/(1−β₁ᵗ))·m/(√v+ε) for raw ε),

      M = 1[u ⊙ p > 0];   p ← p − u − λ·wd_mul·η²·M ⊙ p

  evaluated in fp32 (m and v read in fp32 whatever their dtype) from the stored p, left to
  right, and rounded once to p's dtype (a bf16 parameter has no master copy). Where u⊙p = 0
  (p or u zero) nothing decays.

`optim/build.py` uses this class only when a setting differs from torch's AdamW; otherwise
torch's (fused on CUDA) runs, bit for bit as before: records #9 and #21, whose scripts step
torch's fused Adam, so that their presets compute that kernel's arithmetic. The update itself
is optim/adam_update.py's one function, eager or compiled.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from optim.adam_ddp_rows import AdamShards, grad_or_zeros
from optim.adam_state import MOMENT_DTYPES, gathered, restore_saved
from optim.adam_table import Row
from optim.adam_update import TensorSettings, compiled, host_values
from optim.config import AdamWConfig
from optim.ddp_rows import Comm, Sum
from optim.tied import TiedEmbedHead


class Adam(torch.optim.Optimizer):
    """Adam with `optim.adamw`'s settings (see the module docstring)."""

    def __init__(
        self,
        params: Any,
        settings: AdamWConfig,
        rows: dict[str, Row] | None = None,
        *,
        compile_backend: str | None = None,
        comm: Comm | None = None,
    ) -> None:
        """`rows`: {parameter name: Row} (named parameters' rows; others keep the group's).
        Every due update is one call of optim/adam_update.py's function over lists, compiled
        with `compile_backend` (a torch.compile backend; None: eager). `comm`: share the
        tensors out over its ranks (dist.parallelism=ddp_row_shards; optim/adam_ddp_rows.py)."""
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
        self.compiled = compile_backend is not None
        self._update = compiled(compile_backend)
        self._values: dict[Tensor, list[Tensor]] = {}  # compiled: each tensor's 0-d values
        held = [p for g in self.param_groups for p in g["params"]]
        self.shards = AdamShards(held, comm) if comm is not None else None
        self.defer_finish = False  # CombinedOptimizer finishes a sharded step itself
        # Sharded with a period: each rank sums its own gradients between updates (module
        # docstring), reduced at the update; set when that sum went into the exchange
        self.local_sums = self.shards is not None and settings.update_every > 1
        self._sums_started = False
        if self.shards is not None:
            for p in held:  # every rank's state exists from the start (checkpoints gather it)
                self._state(p)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch casts loaded state to the parameter's dtype; the moments, the counters and
        the pair's partial sums are taken again from the saved values (optim/adam_state.py)."""
        super().load_state_dict(state_dict)
        restore_saved(self, state_dict)

    def state_dict(self) -> dict[str, Any]:
        """torch's state dict; sharded, gathered whole (a collective: optim/adam_state.py)."""
        return gathered(self, super().state_dict())

    def _state(self, p: Tensor) -> dict[str, Tensor]:
        """`p`'s state, created on first use shaped like what this rank updates of `p`."""
        state = self.state[p]
        if "exp_avg" not in state:
            like = self.shards.target(p) if self.shards is not None else p
            dtype = MOMENT_DTYPES.get(self.hp.state_dtype, p.dtype)
            state["step"] = torch.zeros((), dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(like, dtype=dtype)
            state["exp_avg_sq"] = torch.zeros_like(like, dtype=dtype)
            if self.hp.update_every > 1:  # this rank's own sum, whole, where local_sums
                state["grad_sum"] = torch.zeros_like(p if self.local_sums else like)
                state["pending"] = torch.zeros((), dtype=torch.float32)
        return state

    def updates_next(self) -> bool:
        """Whether the next `step()` moves the parameters (optim.adamw.update_every: only
        every k-th call does; a fresh optimizer's k-th)."""
        k = self.hp.update_every
        held = [self.state[p] for g in self.param_groups for p in g["params"] if p in self.state]
        pending = int(held[0]["pending"]) if k > 1 and held and "pending" in held[0] else 0
        return k == 1 or pending == k - 1

    def start_exchange(self) -> None:
        """dist.parallelism=ddp_row_shards: start the gradient reductions (no-op otherwise); with a
        period, only at the update, of each rank's sum over the period."""
        if self.shards is None:
            return
        if not self.local_sums:
            self.shards.start()
        elif not self._sums_started and self.updates_next():
            self.shards.start(self._add_local(last=True))
            self._sums_started = True

    def _add_local(self, last: bool = False) -> dict[Tensor, Tensor | Sum]:
        """local_sums: this step's gradients into this rank's sums, under optim.tie_sum=step
        with E's joined to W's first, as one tensor's gradient would be. The period's first
        gradient becomes the sum itself (`_own`: no copy, and no zeroing after an update);
        at its last step (`last`) the sum is not written back but returned as
        {p: Sum(its sum, this gradient)}, added as the exchange packs it (one pass over the
        tables instead of three)."""
        ready = [(p, grad_or_zeros(p), self._state(p), group)
                 for group in self.param_groups for p in group["params"]]  # fmt: skip
        if self.tie is not None and self.tie.per_step:
            ready = self.tie.join_step(ready, self.state)
        sums, grads = [st["grad_sum"] for _, _, st, _ in ready], [g for _, g, _, _ in ready]
        if last:
            return {p: Sum(total, g) for (p, *_), total, g in zip(ready, sums, grads, strict=True)}
        if int(ready[0][2]["pending"]) == 0:  # the first of the period
            for p, g, st, _ in ready:
                st["grad_sum"] = _own(p, g)
        else:
            torch._foreach_add_(sums, grads)
        return {}

    def finish_exchange(self) -> None:
        """ddp_row_shards (dist.parallelism): every rank's updated rows into place (no-op
        otherwise)."""
        if self.shards is not None:
            self.shards.finish()

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        ready = self._due()
        if ready:
            tie = self.tie  # optim.tie_embed_head_until: E's sum joins W's, E follows W
            due = ready if tie is None else tie.before(ready, self.state)
            self._update_all(due)
            if tie is not None:
                tie.after(self.state, self._target)
            if self.hp.update_every > 1:
                if not self.local_sums:  # local_sums takes the next period's first as it is
                    torch._foreach_zero_([st["grad_sum"] for _, _, st, _ in ready])
                torch._foreach_zero_([st["pending"] for _, _, st, _ in ready])
            if self.shards is not None:
                self.shards.gather()
        if not self.defer_finish:
            self.finish_exchange()
        return loss

    def _target(self, p: Tensor) -> Tensor:
        """What this rank updates of `p` (its rows when sharded)."""
        return self.shards.target(p) if self.shards is not None else p

    def _due(self) -> list[tuple[Tensor, Tensor, dict, dict]]:
        """(p, its gradient or k-step sum, state, group) of every tensor whose update is due
        at this call (none between the k steps of optim.adamw.update_every); the gradient of
        a sharded tensor is its rows' average over ranks."""
        if self.local_sums:
            return self._due_local()
        reduced = self.shards.gradients() if self.shards is not None else {}
        ready = []
        for group in self.param_groups:
            for p in group["params"]:
                g = reduced.get(p, p.grad)
                ready.append((p, g if g is not None else torch.zeros_like(p), self._state(p),
                              group))  # fmt: skip
        if self.tie is not None and self.tie.per_step:  # optim.tie_sum=step: E's joins W's now
            ready = self.tie.join_step(ready, self.state)
        if self.hp.update_every == 1:
            return ready
        # The partial sums are state (a checkpoint inside a pair resumes exactly); a tensor
        # without a gradient adds zeros, so all reach their update together.
        torch._foreach_add_([st["grad_sum"] for _, _, st, _ in ready], [g for _, g, _, _ in ready])
        torch._foreach_add_([st["pending"] for _, _, st, _ in ready], 1.0)
        waiting = [int(st["pending"]) < self.hp.update_every for _, _, st, _ in ready]
        if any(waiting):
            if not all(waiting):
                raise RuntimeError("Adam's tensors reached an update apart (optim.adamw)")
            return []
        return [(p, st["grad_sum"], st, group) for p, _, st, group in ready]

    def _due_local(self) -> list[tuple[Tensor, Tensor, dict, dict]]:
        """`_due` where each rank sums its own gradients (local_sums): between updates the
        gradient joins this rank's sum and nothing is exchanged; at the update each
        gradient is the sums' average over ranks (this rank's rows of a sharded tensor)."""
        held = [(p, self._state(p), g) for g in self.param_groups for p in g["params"]]
        if not self.updates_next():
            self._add_local()
            torch._foreach_add_([st["pending"] for _, st, _ in held], 1.0)
            return []
        self.start_exchange()  # a no-op when the loop started it
        self._sums_started = False
        assert self.shards is not None  # local_sums implies sharded
        reduced = self.shards.gradients()
        torch._foreach_add_([st["pending"] for _, st, _ in held], 1.0)
        return [(p, reduced[p], st, group) for p, st, group in held]

    def _update_all(self, due: list[tuple[Tensor, Tensor, dict, dict]]) -> None:
        """Every due update in one call of optim/adam_update.py's function: its changing
        values as Python numbers eager, as 0-d tensors filled in place compiled (a new
        number would recompile)."""
        torch._foreach_add_([st["step"] for _, _, st, _ in due], 1.0)
        settings, values = [], []
        hp = self.hp
        for p, _, state, group in due:
            row = self.rows.get(p)
            beta1, beta2 = group["betas"] if row is None else row.betas
            lr = group["lr"] * getattr(p, "lr_mul", 1.0)
            decay = group["weight_decay"]
            if row is not None:
                lr, decay = lr * row.lr_mul, decay * row.wd_mul
            s = TensorSettings(beta1, beta2, group["eps"], hp.eps_placement == "raw",
                               hp.weight_decay_form == "cautious", decay != 0)  # fmt: skip
            numbers = host_values(s, lr, decay, int(state["step"]))
            settings.append(s)
            if not self.compiled:
                values.append(numbers)
                continue
            held = self._values.setdefault(p, [torch.zeros((), dtype=torch.float64)
                                               for _ in range(3)])  # fmt: skip
            for tensor, value in zip(held, numbers, strict=True):
                tensor.fill_(value)
            values.append(held)
        self._update(
            tuple(settings), [self._target(p) for p, _, _, _ in due], [g for _, g, _, _ in due],
            [st["exp_avg"] for _, _, st, _ in due], [st["exp_avg_sq"] for _, _, st, _ in due],
            values,
        )  # fmt: skip


def _own(p: Tensor, g: Tensor) -> Tensor:
    """`g`, this step's gradient of `p`, taken as a period's first sum: its own tensor (what
    autograd wrote, or a fresh one: zeros, a joined sum) without a copy, `p.grad` cleared so
    that nothing else can write to it (a zero_grad that zeroes in place would wipe the sum).
    A view of another tensor (a bucket's, a slice) is copied: its owner may write it."""
    if g._base is not None:
        return g.clone()
    if p.grad is g:
        p.grad = None
    return g
