"""Muon: momentum, then orthogonalise the update of each hidden weight matrix.

For every 2-D parameter W with gradient g (Keller Jordan's Muon, 2024; the same update as
`torch.optim.Muon`), in the notation of optim/muon/update.py:

    buf  <- lerp(buf, g, 1 - momentum)                  # EMA momentum
    u    <- lerp(g, buf, momentum) if nesterov else buf
    O    <- NewtonSchulz(u)                             # ≈ U Vᵀ of u = U S Vᵀ
    W    <- W · (1 - lr · weight_decay) - lr · scale(shape) · O

What differs from `torch.optim.Muon` is speed: Newton–Schulz runs once per *shape*, batched over
all matrices of that shape (tall ones transposed to their wide side first, so a 3072×768 and a
768×3072 share a batch), instead of once per matrix, and with the operand layout that CPU bf16
matmuls are fastest with (see `zeropower`). `scripts/bench/muon_step.py` measures the difference.

Every setting comes in one `MuonConfig` (`settings`, or keyword overrides of its fields); the
param groups carry what a schedule may change per step or per group: "lr", "momentum" and
"weight_decay" (and a loaded state dict restores them, as torch's optimizers do). One step
skeleton serves every distributed arrangement: per param group, a `Strategy`
(optim/muon/strategies.py, optim/muon/fsdp_strategies.py) says which gradients this rank's momentum
takes and how orthogonalised updates reach the ranks that apply them:

- one process (no `process_group`, or one rank): everything here;
- `process_group` with parallelism ddp_all_gather | ddp_all_reduce: matrix i orthogonalised by
  its owner rank, finished updates exchanged; momentum replicated, so checkpoints do not
  depend on the world size;
- ddp_owners: gradients reduced to owners, momentum on the owner only, parameters
  all-gathered; `state_dict()` gathers the momentum (a collective);
- ddp_row_shards: the banks' rows shared out (`comm`, optim/ddp_rows.py);
- fsdp_gather | fsdp_tp (FSDP2 DTensor shards; the group is their mesh's): shards sent to
  owners and rows back, or Newton–Schulz run tensor-parallel.

The 2026-07 record's variants: a (4, d, d) W_q, W_k, W_v, W_o stack seen as head-pair blocks
and whole W_v, W_o, NorMuon's axis and precision (optim/muon/normuon.py), and bf16 matrices
stepped on an fp32 master (optim/muon/master.py); these two need each whole matrix where it
is applied, so they refuse ddp_owners and the fsdp parallelisms, as NorMuon does.
"""

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.optim.optimizer import ParamsT
from torch.profiler import record_function

from optim.config import MuonConfig
from optim.ddp_rows import Comm
from optim.fsdp_rows import local
from optim.muon.banked import BankedGroups
from optim.muon.choose import strategy_for
from optim.muon.master import new_mantissa
from optim.muon.newton_schulz import chosen_coefficients, orthogonalise
from optim.muon.normuon import head_rows, merge, moment_shape, pieces, stat_dim
from optim.muon.stacks import check_stack
from optim.muon.strategies import OwnerOnly, Strategy
from optim.muon.update import host_values, momentum, step_matrix
from optim.parallelism import DEFAULT, PARALLELISMS


class Muon(torch.optim.Optimizer):
    """Muon for matrices (2-D, or stacks of them); see the module docstring."""

    def __init__(
        self,
        params: ParamsT,
        settings: MuonConfig | None = None,
        *,
        ns_dtype: torch.dtype = torch.bfloat16,
        process_group: dist.ProcessGroup | None = None,
        parallelism: str = DEFAULT,
        banks: bool = False,
        compile_backend: str | None = None,
        comm: Comm | None = None,
        **overrides: Any,
    ) -> None:
        """`overrides`: `MuonConfig` fields to change from `settings` (default: the config's
        defaults). `process_group` is passed explicitly, never a silent fallback to the world
        group; `parallelism` (dist.parallelism, optim/parallelism.py) says what Muon does on
        its ranks; an fsdp one takes DTensor shards, whose mesh decides the group. `banks`:
        step each group's same-shape matrices as stacks (optim/muon/banked.py), compiled with
        `compile_backend` (a torch.compile backend; None: uncompiled); `comm`: share the
        banks' rows out over its ranks (ddp_row_shards, whose exchange it is; implies
        `banks`)."""
        self.hp = replace(settings or MuonConfig(), **overrides)
        self.hp.validate()
        self.ns_dtype = ns_dtype  # the hardware's choice, not a param-group setting
        self.coefficients = chosen_coefficients(self.hp)
        # The stepping group's Newton–Schulz (coefficients, steps): its own, or the settings'
        self._ns = (self.coefficients, self.hp.ns_steps)
        self._head_rows: dict[int, int] = {}  # the stepping group's split stacks (qk_split)
        if parallelism not in PARALLELISMS:
            raise ValueError(f"Muon parallelism must be one of {' | '.join(PARALLELISMS)}, "
                             f"got {parallelism!r}")  # fmt: skip
        if comm is not None:  # the exchange of ddp_row_shards, in place of a process group
            if process_group is not None or parallelism not in (DEFAULT, "ddp_row_shards"):
                raise ValueError(
                    "Muon takes `comm` (parallelism=ddp_row_shards' exchange) or a process "
                    f"group; got both, or parallelism={parallelism}"
                )
            parallelism = "ddp_row_shards"
        self.parallelism = parallelism
        self.strategy = strategy_for(
            parallelism, process_group, self.hp, self.newton_schulz, ns_dtype
        )
        hp = self.hp
        super().__init__(
            params, {"lr": hp.lr, "momentum": hp.momentum, "weight_decay": hp.weight_decay}
        )
        self.strategy.setup(self.param_groups, ns_dtype)
        self.banked: BankedGroups | None = None
        if banks or comm is not None:
            if type(self.strategy) is not Strategy:
                raise ValueError(
                    "optim.compile=true steps Muon's matrices as banks, in one process or "
                    f"with dist.parallelism=ddp_row_shards; got several ranks with "
                    f"dist.parallelism={parallelism}"
                )
            self.banked = BankedGroups(self.param_groups, self.hp, ns_dtype, self.state_dtype,
                                       compile_backend, comm)  # fmt: skip
            self.banked.attach(self.state)
        self.defer_finish = False  # CombinedOptimizer finishes a sharded step itself

    def start_exchange(self) -> None:
        """ddp_row_shards: start the gradient reduction (no-op otherwise)."""
        if self.banked is not None:
            self.banked.start(self.param_groups)

    def finish_exchange(self) -> None:
        """ddp_row_shards: every rank's new weights into place (no-op otherwise)."""
        if self.banked is not None:
            self.banked.finish()

    @property
    def sharded(self) -> bool:
        """True when the parameters are FSDP2 shards (their state is sharded too)."""
        return self.strategy.sharded

    @property
    def owner_only(self) -> bool:
        """True when each rank keeps the momentum of the matrices it owns only."""
        return self.strategy.owner_only

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group (the constructor adds its groups this way too), validating it first."""
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        try:
            per_group = {k: group[k] for k in ("lr", "momentum", "weight_decay")}
            replace(self.hp.for_group(group), **per_group).validate()
            for p in group["params"]:
                if p.ndim < 2:
                    raise ValueError(
                        f"Muon only takes matrices (2-D, or stacks of them), got a parameter "
                        f"of shape {tuple(p.shape)}; give embeddings, gains and biases to AdamW"
                    )
                check_stack(p)
                if 0 in p.shape:
                    # Newton–Schulz divides by the norm and the LR scale by a dimension.
                    raise ValueError(
                        f"Muon can't step a parameter with a zero-size dimension, shape "
                        f"{tuple(p.shape)}: leave it out of Muon's groups (optim.roles)"
                    )
                self.strategy.check_param(p)
                if self.hp.master_weights != "none":
                    new_mantissa(p)  # raises unless bf16
        except ValueError:
            self.param_groups.pop()  # leave the optimizer as it was
            raise
        if self.strategy.eager_state:
            for p in group["params"]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)

    @property
    def state_dtype(self) -> torch.dtype | None:
        """The momentum's and second moments' dtype: fp32 with a master, else the param's."""
        return torch.float32 if self.hp.master_weights != "none" else None

    def _moments(self, p: Tensor) -> list[Tensor]:
        """NorMuon's second moments of `p`, one per piece (state "second_moment", then
        "second_moment_1"), made on first use; [] without NorMuon."""
        if not self.hp.normuon_beta2:
            return []
        state, out = self.state[p], []
        for k, part in enumerate(pieces(torch.empty(p.shape, device="meta"), head_rows(p))):
            key = "second_moment" + (f"_{k}" if k else "")
            if key not in state:
                shape = moment_shape(part.shape, stat_dim(part.shape, self.hp.normuon_axis))
                state[key] = p.new_zeros(shape, dtype=self.state_dtype or p.dtype)
            out.append(state[key])
        return out

    def newton_schulz(self, updates: dict[int, Tensor]) -> dict[int, Tensor]:
        """Newton–Schulz of each update, batched by shape, in `ns_dtype`; a split stack
        (qk_split) as its head-pair blocks and its W_v, W_o, put back together after."""
        hp = self.hp
        flat: list[Tensor] = []
        where: list[int] = []  # the update each entry of `flat` belongs to
        for i, u in updates.items():
            for part in pieces(u, self._head_rows.get(i, 0)):
                flat.append(part)
                where.append(i)
        coefficients, steps = self._ns
        out = orthogonalise(flat, coefficients, steps, hp.eps, self.ns_dtype, hp.ns_form)
        parts: dict[int, list[Tensor]] = {}
        for k, i in enumerate(where):
            parts.setdefault(i, []).append(out[k])
        return {i: merge(ps, updates[i].shape) for i, ps in parts.items()}

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        """One Muon step; `closure`, if given, recomputes and returns the loss (with grads).
        Each matrix takes Muon's one update (optim/muon/update.py) as a stack of one, eager,
        with the exchange of its strategy between momentum and the rest."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self.banked is not None:
            with record_function("muon.banks"):
                self.banked.step(self.param_groups)
            if not self.defer_finish:
                self.finish_exchange()
            return loss
        hp = self.hp
        for index, group in enumerate(self.param_groups):
            params = group["params"]
            work = self.strategy.gradients(index, group)
            if work is None:
                continue
            self._head_rows = {i: head_rows(p) for i, p in enumerate(params) if head_rows(p)}
            own = hp.for_group(group)
            self._ns = (self.coefficients if own is hp else chosen_coefficients(own), own.ns_steps)
            values = {dtype: host_values(group, hp, dtype) for dtype in {p.dtype for p in params}}
            grads, mine = work  # a rank may hold none (it owns no matrix) and still takes part
            updates: dict[int, Tensor] = {}
            with record_function("muon.momentum"):
                for i in self.strategy.order(index, group, grads):
                    # popped: the strategy may drop the gradient itself once it is taken
                    u = self._momentum(params[i], grads.pop(i), values, i in mine)
                    if u is not None:
                        updates[i] = u
                    self.strategy.taken(index, group, i, updates)
            with record_function("muon.newton_schulz"):  # with the strategy's exchange
                orthogonal = self.strategy.orthogonalise(index, group, updates)
            with record_function("muon.finish"):
                for i, update in orthogonal.items():
                    self._finish(params[i], update, values[params[i].dtype])
                self.strategy.finish(index, group)
        return loss

    def _momentum(self, p: Tensor, g: Tensor, values: dict, look_ahead: bool) -> Tensor | None:
        """Matrix p's momentum takes gradient g; its update to orthogonalise, if `look_ahead`."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=self.state_dtype)
        buf = local(state["momentum_buffer"])
        return momentum(g, buf, values[p.dtype], self.hp, look_ahead, w=local(p))

    def _finish(self, p: Tensor, update: Tensor, values: dict[str, float]) -> None:
        """The rest of the update of matrix `p` from its orthogonalised `update` (or this
        rank's rows of both): NorMuon and the master need the whole matrix (`strategy_for`)."""
        mantissa = None
        if self.hp.master_weights != "none":
            if "mantissa" not in self.state[p]:
                self.state[p]["mantissa"] = new_mantissa(p)
            mantissa = self.state[p]["mantissa"]
        step_matrix(local(p), update, {}, self.hp, float(getattr(p, "lr_mul", 1.0)),
                    shape=p.shape, head_rows=head_rows(p), moments=self._moments(p),
                    mantissa=mantissa, values=values)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The optimizer state, with every momentum buffer, whatever the strategy and world
        size. Owner-only (ddp_owners on several ranks) gathers the owners'
        buffers, so every rank must call it (a rank-0-only call would wait forever)."""
        if self.banked is not None and self.banked.comm is not None:
            return self._banked_state_dict()
        sd = super().state_dict()
        strategy = self.strategy
        if not isinstance(strategy, OwnerOnly):
            return sd
        device = next(p.device for g in self.param_groups for p in g["params"])
        has = any("momentum_buffer" in s for s in self.state.values())
        if not strategy.any_rank(has, device):
            return sd
        for index, group in enumerate(self.param_groups):
            params = group["params"]
            mine = {
                i: self.state[p]["momentum_buffer"]
                for i, p in enumerate(params)
                if "momentum_buffer" in self.state[p]
            }
            buffers = strategy.gather_buffers(index, params, mine)
            # state_dict() numbers the parameters of all groups in order: group `index` holds
            # the numbers listed in its packed "params".
            numbers = sd["param_groups"][index]["params"]
            for number, buf in zip(numbers, buffers, strict=True):
                # a copy: torch packs the live state dicts, and a rank that owns no buffer
                # must not keep one after a save
                sd["state"][number] = {**sd["state"].get(number, {}), "momentum_buffer": buf}
        return sd

    def _banked_state_dict(self) -> dict[str, Any]:
        """Sharded banks: every parameter's whole state, gathered from its owner (a
        collective), in torch's positional form."""
        whole = self.banked.gathered_state()  # type: ignore[union-attr]  # the caller checks
        sd = super().state_dict()
        numbers = [n for g in sd["param_groups"] for n in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        sd["state"] = {n: whole[p] for n, p in zip(numbers, params, strict=True) if p in whole}
        return sd

    def _restore_state_dtype(self, state_dict: dict[str, Any]) -> None:
        """Put back the fp32 momentum and second moments of bf16 matrices (master_weights)
        and the int16 low halves of their masters, all of which torch's `load_state_dict`
        casts to the parameter's dtype (the mantissa's bits would be lost)."""
        numbers = [n for g in state_dict["param_groups"] for n in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for number, p in zip(numbers, params, strict=True):
            for key, value in state_dict["state"].get(number, {}).items():
                if key in self.state[p] and torch.is_tensor(value):
                    dtype = self.state_dtype if value.is_floating_point() else value.dtype
                    self.state[p][key] = value.to(p.device, dtype, copy=True)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state saved by any strategy on any world size; owner-only keeps its share."""
        super().load_state_dict(state_dict)
        if self.state_dtype is not None:
            self._restore_state_dtype(state_dict)
        if self.banked is not None:  # this rank's rows into the stacks, the views back
            self.banked.load(self.state, {p: dict(self.state[p]) for p in list(self.state)})
        if not isinstance(self.strategy, OwnerOnly):
            return
        for index, group in enumerate(self.param_groups):
            owned = self.strategy.owned(index, group["params"])
            for p, mine in zip(group["params"], owned, strict=True):
                if not mine:
                    self.state[p].pop("momentum_buffer", None)
