"""One optimizer object for a whole model: its Muon and AdamW parts and their state.

The loop sees only this object: `set_step(values)` takes the step's values from the run's
schedule (each group's LR from its base LR, the momentum of the groups that take the
scheduled one), `step()` and `zero_grad()` act on every part, `lrs()` names each group's
current LR for logging, and `state_dict()` / `load_state_dict()` carry every part's state
through a checkpoint. Which parts exist and what they hold is `optim/build.py`'s business
(the table in optim/groups.py); nothing outside `optim/` needs to know.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor
from torch.profiler import record_function

import optim.flat_state as flat
from optim.adam import Adam
from optim.muon.optimizer import Muon
from optim.offload import StateOffload
from optim.qk_clip import QKClip
from optim.schedule import OptimValues


class CombinedOptimizer:
    def __init__(
        self,
        parts: list[torch.optim.Optimizer],
        summary: str,
        groups_table: str = "",
        self_reduced: list[str] | None = None,
        offload: StateOffload | None = None,
        clip: QKClip | None = None,
        exchanges: bool = False,
    ) -> None:
        """`parts` in a fixed order (a checkpoint lists their states in it); every param
        group carries a unique "name", its parameters' "param_names", its base LR as
        "initial_lr" and, if it takes the scheduled momentum, "scheduled_momentum".
        `groups_table`: the groups as printed at startup. `self_reduced`: names of the
        parameters whose gradients a part averages across ranks itself. `offload`: keeps the
        parts' state in CPU memory between steps. `clip`: QK-clip, applied after every step
        (its numbers in `stats`)."""
        if not parts:
            raise ValueError("the model has no trainable parameters to optimize")
        self.parts = parts
        self.summary = summary
        self.groups_table = groups_table
        self.self_reduced = list(self_reduced or [])
        self.offload = offload
        self._resident_depth = 0
        self.clip = clip
        # Adam first: its small all-reduce and its tables' reductions lead, Muon's banks
        # follow while Adam computes, and Adam's gather runs while Muon computes.
        self.exchanging = sorted(parts, key=lambda o: isinstance(o, Muon)) if exchanges else []
        for opt in self.exchanging:
            opt.defer_finish = True
        self.stats: dict[str, float | int] = {}  # the last step's numbers to log (QK-clip)
        if clip is not None:
            clip.start()
        names = [g["name"] for opt in parts for g in opt.param_groups]
        if len(set(names)) != len(names):
            raise ValueError(f"param group names must be unique, got {names}")

    def set_step(self, values: OptimValues) -> None:
        """Take the schedule's values for the coming update.

        Each LR is set from the group's base LR, never from the previous step's, so the LR at
        a step does not depend on the run's history (a resumed run follows the same curve).
        """
        for opt in self.parts:
            for group in opt.param_groups:
                group["lr"] = group["initial_lr"] * values.lr_mult
                if group.get("scheduled_momentum"):
                    group["momentum"] = values.muon_momentum

    def step(self) -> None:
        """Every part's step; each is a named range in a torch.profiler trace (`optim.muon`,
        `optim.adam`, `optim.adamw`, and `optim.exchange.start` / `.finish`, `optim.offload`,
        `optim.qk_clip` where they run), Muon's phases within its own (optim/muon/optimizer.py)."""
        if self.exchanging:
            with record_function("optim.exchange.start"):
                for opt in self.exchanging:
                    opt.start_exchange()
            for opt in self.exchanging:
                with record_function(_range(opt)):
                    opt.step()
            with record_function("optim.exchange.finish"):
                for opt in self.exchanging:
                    opt.finish_exchange()
        elif self.offload is None:
            for opt in self.parts:
                with record_function(_range(opt)):
                    opt.step()
        else:
            with record_function("optim.offload"):
                self.offload.fetch_all()
            for k, opt in enumerate(self.parts):
                with record_function("optim.offload"):
                    self.offload.wait(k)
                with record_function(_range(opt)):
                    opt.step()
                with record_function("optim.offload"):
                    self.offload.store(k)
            self.offload.release()
        if self.clip is not None:
            with record_function("optim.qk_clip"):
                self.stats = self.clip.apply()

    def period(self) -> int:
        """Steps per period of the update: the largest optim.adamw.update_every among the
        parts (1: every step updates every part)."""
        return max([opt.hp.update_every for opt in self.parts if isinstance(opt, Adam)] or [1])

    def full_next(self) -> bool:
        """Whether the next `step()` updates every part: False on the steps where Adam only
        sums its gradient (optim.adamw.update_every > 1), which cost less."""
        return all(opt.updates_next() for opt in self.parts if isinstance(opt, Adam))

    @contextmanager
    def resident(self) -> Iterator[None]:
        """Every part's state on the device for the block (a no-op without offload)."""
        if self.offload is None or self._resident_depth:
            yield
            return
        self._resident_depth += 1
        self.offload.fetch_all()
        for k in range(len(self.parts)):
            self.offload.wait(k)
        try:
            yield
        finally:
            self._resident_depth -= 1
            self.offload.store_all()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.parts:
            opt.zero_grad(set_to_none=set_to_none)
        if self.clip is not None:  # a skipped step's logits must not count for the next
            self.clip.reset()

    def params(self) -> list[torch.Tensor]:
        """Every parameter this object trains."""
        return [p for opt in self.parts for g in opt.param_groups for p in g["params"]]

    def lrs(self) -> dict[str, float]:
        """The current LR of every param group, by group name ("muon", "embed", ...)."""
        return {g["name"]: g["lr"] for opt in self.parts for g in opt.param_groups}

    def state_dict(self) -> list[dict[str, Any]]:
        """Every part's state, in build order. A collective when Muon keeps owner-only momentum
        (dist.parallelism=ddp_owners on several ranks): every rank must call it."""
        with self.resident():
            states = [opt.state_dict() for opt in self.parts]
            return [_copied(s) for s in states] if self.offload else states

    def flat_state(self) -> dict[str, Tensor]:
        """Every state tensor by "<group>/<parameter>/<key>" (`optim/flat_state.py`): the live
        tensors, for Distributed Checkpoint to save or to load into in place. Call inside
        `resident()` when offloading (outside it their storage is freed: a RuntimeError)."""
        if self.offload is not None and not self._resident_depth:
            raise RuntimeError(
                "flat_state() with the optimizer state offloaded (optim.offload=true) would "
                "hand out tensors whose storage is freed: call it inside optimizer.resident()"
            )
        return flat.flat_state(self.parts)

    def set_offload(self, on: bool) -> None:
        """Turn optimizer-state offload on or off between two steps, as optim.offload does
        from the start (optim/offload.py): on, every state tensor's device storage is freed
        after each update and refilled before the next; off, the state stays on the device
        from now on. Either way the steps compute bit for bit what they would have."""
        if on == (self.offload is not None):
            return
        if self._resident_depth:
            raise RuntimeError("set_offload inside optimizer.resident(): call it between steps")
        if not on:
            assert self.offload is not None
            self.offload.fetch_all()
            for k in range(len(self.parts)):
                self.offload.wait(k)
            self.offload = None
            return
        banked = any(getattr(opt, "banked", None) is not None for opt in self.parts)
        if banked or self.exchanging:
            # As optim.offload's own refusals: the banks' state tensors are views of shared
            # stacks, whose storage offload would free under every view at once.
            raise ValueError(
                "optimizer-state offload can't run with optim.compile=true or "
                "dist.parallelism=ddp_row_shards (Muon's banks); turn those off to offload"
            )
        self.init_state()
        self.offload = StateOffload(self.parts, self.params()[0].device)
        self.offload.store_all()

    def load_flat(self, values: dict[str, Tensor]) -> None:
        """Load a flat map of *whole* tensors (from any layout or world size) into this
        run's state: shards take their rows, positional parts go through `load_state_dict`."""
        with self.resident():
            live = self.flat_state()
            if live.keys() == values.keys():
                for key, target in live.items():
                    flat.copy_global(target, flat.whole_sum(key, target, values[key]))
                return
            if any(getattr(opt, "sharded", False) for opt in self.parts):
                differ = sorted(live.keys() ^ values.keys())[:3]
                raise ValueError(f"the saved optimizer state differs in {differ} (and maybe more)")
            self.load_state_dict(flat.to_positional(self.parts, values))

    def init_state(self) -> None:
        """Create every part's state now (sharded runs and offload need it on every rank)."""
        for opt in self.parts:
            flat.init_state(opt)

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
        with self.resident():
            self._load(states)

    def _load(self, states: list[dict[str, Any]]) -> None:
        for opt, state in zip(self.parts, states, strict=True):
            saved = state["param_groups"]
            if len(saved) != len(opt.param_groups):
                raise ValueError(
                    f"the saved {type(opt).__name__} has {len(saved)} parameter groups, this "
                    f"run's has {len(opt.param_groups)}"
                )
            saved = [
                in_live_order(old, new) for old, new in zip(saved, opt.param_groups, strict=True)
            ]
            fresh = [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
            # Settings replaced before loading, so torch places the state (e.g. AdamW's step
            # counters) as this run's flags need.
            groups = [{**old, **new} for old, new in zip(saved, fresh, strict=True)]
            opt.load_state_dict({**state, "param_groups": groups})


def in_live_order(saved: dict[str, Any], live: dict[str, Any]) -> dict[str, Any]:
    """A saved param group with its parameters in the order of the live group's names, so
    each state goes to the parameter it was saved for, not to the one at its old place (torch
    loads by position; a parameter's place in its group follows the model's module tree,
    which a later layout may order otherwise). Groups saved without names load as they are.
    Raises ValueError naming the parameters that one side has and the other lacks."""
    names, want = saved.get("param_names"), live.get("param_names")
    if names is None or want is None or names == want:
        return saved
    if set(names) != set(want):
        differ = sorted(set(names) ^ set(want))[:3]
        raise ValueError(
            f"the saved param group {saved.get('name')!r} holds other parameters than this "
            f"run's: {differ} (and maybe more)"
        )
    place = dict(zip(names, saved["params"], strict=True))
    return {**saved, "params": [place[n] for n in want], "param_names": list(want)}


def _copied(state: dict[str, Any]) -> dict[str, Any]:
    """`state` with its tensors cloned: offload frees the live ones' storage after the call."""
    return {
        "state": {
            n: {k: v.clone() if isinstance(v, Tensor) else v for k, v in s.items()}
            for n, s in state["state"].items()
        },
        "param_groups": state["param_groups"],
    }


def _range(opt: torch.optim.Optimizer) -> str:
    """The profiler range of a part's step: optim.muon, optim.adam, optim.adamw."""
    return f"optim.{type(opt).__name__.lower()}"
