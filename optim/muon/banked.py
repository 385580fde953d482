"""Muon's param groups stepped as banks (optim/muon/banks.py): the stacked state, Muon's one
update (optim/muon/update.py) compiled, and, under `dist.parallelism=ddp_row_shards`, the exchange
that gives each rank its banks' rows.

In one process every bank's rows are this process's: a step stacks each bank's gradients and
weights, runs the group's update (one compiled graph), and copies the new weights back.

Sharded over W ranks (`comm`, optim/ddp_rows.py), rank r updates ⌈k/W⌉ consecutive matrices of
each bank of k and keeps their state only (1/W of it):

    start   the gradients of every matrix, packed, reduce-scattered: each rank receives the
            average over ranks of its own matrices' gradients (Muon's gradients skip DDP)
    step    the update of its rows; the new weights start their all-gather
    finish  every rank copies every matrix's new weights into place

The three are separate so that `CombinedOptimizer` can start every part's reduction before
any part computes, and let Adam's gather run while Muon computes (optim/combined.py).
`state_dict` gathers the owners' rows into whole per-parameter state (a collective), and
`load_state_dict` takes this rank's rows of whole state, so checkpoints do not depend on the
world size.
"""

from typing import Any

import torch
from torch import Tensor

from optim.config import MuonConfig
from optim.ddp_rows import Comm, RowExchange, gather_rows
from optim.muon.banks import Bank, make_banks, state_keys
from optim.muon.newton_schulz import chosen_coefficients
from optim.muon.update import Settings, compiled, fill, host_values, scalar_tensors

Group = dict[str, Any]


class ExchangeByDtype:
    """A group's banks' row exchange (optim/ddp_rows.py `RowExchange`), one per dtype of its banks
    (record_medium_2025_12_31's fp32 matrices beside its bf16 gates), with RowExchange's calls, each
    taking or giving one entry per bank in the banks' order."""

    def __init__(self, banks: list[Bank], comm: Comm) -> None:
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, b in enumerate(banks):
            by_dtype.setdefault(b.layout.dtype, []).append(i)
        self.count = len(banks)
        self.parts = [
            (idx, RowExchange([(len(banks[i].params), *banks[i].layout.shape) for i in idx],
                              dtype, banks[idx[0]].params[0].device, comm))
            for dtype, idx in by_dtype.items()
        ]  # fmt: skip

    def _split(self, items: list) -> list[list]:
        return [[items[i] for i in idx] for idx, _ in self.parts]

    def prime(self, targets: list) -> None:
        for (_, ex), mine in zip(self.parts, self._split(targets), strict=True):
            ex.prime(mine)

    def reduce(self, tensors: list) -> None:
        for (_, ex), mine in zip(self.parts, self._split(tensors), strict=True):
            ex.reduce(mine)

    def reduced(self) -> list[Tensor]:
        out: list[Tensor] = [torch.empty(0)] * self.count
        for idx, ex in self.parts:
            for i, rows in zip(idx, ex.reduced(), strict=True):
                out[i] = rows
        return out

    def gather(self, mine: list[Tensor]) -> None:
        for (_, ex), part in zip(self.parts, self._split(mine), strict=True):
            ex.gather(part)

    @property
    def gathering(self) -> bool:
        return any(ex.gathering for _, ex in self.parts)

    def unpack(self, targets: list) -> None:
        for (_, ex), part in zip(self.parts, self._split(targets), strict=True):
            if ex.gathering:
                ex.unpack(part)


class BankedGroups:
    """Every param group of a Muon optimizer as banks (see the module docstring)."""

    def __init__(
        self,
        groups: list[Group],
        hp: MuonConfig,
        ns_dtype: torch.dtype,
        state_dtype: torch.dtype | None,
        backend: str | None,
        comm: Comm | None = None,
    ) -> None:
        self.hp, self.comm = hp, comm
        world, rank = (comm.world, comm.rank) if comm is not None else (1, 0)
        self.banks = [make_banks(g["params"], hp, state_dtype, world, rank) for g in groups]
        self.update = compiled(backend)
        self.ns_dtype = ns_dtype
        self._settings: dict[tuple, Settings] = {}  # by the group's Newton–Schulz choice
        self.scalars = [[scalar_tensors() for _ in banks] for banks in self.banks]
        self.exchanges: list[ExchangeByDtype | None] = []
        for banks in self.banks:
            ex = None
            if comm is not None and banks:
                ex = ExchangeByDtype(banks, comm)
                if comm.local:
                    ex.prime([[p.detach() for p in b.params] for b in banks])
            self.exchanges.append(ex)
        self._started = False

    def attach(self, state: dict) -> None:
        """Make each owned parameter's state entries views of the stacks' rows."""
        for bank in (b for banks in self.banks for b in banks):
            for key, stack in state_keys(bank):
                for j, p in enumerate(bank.mine):
                    state[p][key] = stack[j]

    def start(self, groups: list[Group]) -> None:
        """Sharded: start every group's gradient reduction (no-op in one process)."""
        if self._started:
            return
        for index, group in enumerate(groups):
            ex = self.exchanges[index]
            if ex is None or not self._has_grads(group, index):
                continue
            ex.reduce([[p.grad for p in b.params] for b in self.banks[index]])
        self._started = True

    def step(self, groups: list[Group]) -> None:
        """Every group's update of this rank's rows; sharded, the gathers are started."""
        self.start(groups)
        self._started = False
        for index, group in enumerate(groups):
            banks, ex = self.banks[index], self.exchanges[index]
            if not self._has_grads(group, index):
                continue
            values = self.scalars[index]
            for bank, held in zip(banks, values, strict=True):
                fill(held, host_values(group, self.hp, bank.layout.dtype))
            if ex is None:
                grads = [torch.stack([p.grad for p in b.params]) for b in banks]
            else:
                grads = ex.reduced()
            weights = [
                torch.stack([p.detach() for p in b.mine]) if b.mine else
                torch.empty((0, *b.layout.shape), dtype=b.layout.dtype, device=b.momentum.device)
                for b in banks
            ]  # fmt: skip
            new = self.update(
                self.settings(group), tuple(b.layout for b in banks), grads, weights,
                [b.momentum for b in banks], [b.moments for b in banks],
                [b.mantissa for b in banks], [b.lr_mul for b in banks], values,
            )  # fmt: skip
            if ex is None:
                for bank, w in zip(banks, new, strict=True):
                    torch._foreach_copy_([p.detach() for p in bank.params], list(w.unbind(0)))
            else:
                ex.gather(new)

    def settings(self, group: Group) -> Settings:
        """What the group's update is specialised to: the settings with its own Newton–Schulz
        (`MuonConfig.for_group`), one object per distinct choice (a compiled graph's guard)."""
        hp = self.hp.for_group(group)
        key = (hp.ns_steps, hp.ns_coefficients, str(hp.ns_custom), hp.ns_custom_norm_scale)
        if key not in self._settings:
            self._settings[key] = Settings(hp, self.ns_dtype, chosen_coefficients(hp))
        return self._settings[key]

    def finish(self) -> None:
        """Sharded: wait for the gathers and copy every matrix's weights into place."""
        for banks, ex in zip(self.banks, self.exchanges, strict=True):
            if ex is not None and ex.gathering:
                ex.unpack([[p.detach() for p in b.params] for b in banks])

    def _has_grads(self, group: Group, index: int) -> bool:
        """Whether the group takes a step: every matrix has a gradient (all or none)."""
        have = [p.grad is not None for p in group["params"]]
        if all(have):
            return True
        if any(have):
            missing = [i for i, h in enumerate(have) if not h]
            raise RuntimeError(
                "Muon over banks (optim.compile, dist.parallelism=ddp_row_shards) needs a "
                f"gradient for every matrix; parameters {missing} of group "
                f"{group.get('name', index)!r} have none"
            )
        return False

    def gathered_state(self) -> dict[Tensor, dict[str, Tensor]]:
        """{parameter: {key: whole state}} of every parameter, from the owners' rows (a
        collective when sharded)."""
        out: dict[Tensor, dict[str, Tensor]] = {}
        for bank in (b for banks in self.banks for b in banks):
            for key, stack in state_keys(bank):
                whole = stack if self.comm is None else gather_rows(stack, len(bank.params),
                                                                     self.comm)  # fmt: skip
                for p, row in zip(bank.params, whole, strict=True):
                    out.setdefault(p, {})[key] = row
        return out

    def load(self, state: dict, saved: dict[Tensor, dict[str, Tensor]]) -> None:
        """This rank's rows of the whole per-parameter `saved` state into the stacks; the
        parameters it does not own keep no state here."""
        for bank in (b for banks in self.banks for b in banks):
            for key, stack in state_keys(bank):
                for j, p in enumerate(bank.mine):
                    if key in saved.get(p, {}):
                        stack[j].copy_(saved[p][key])
            for p in bank.params[: bank.start] + bank.params[bank.stop :]:
                state.pop(p, None)
        self.attach(state)

    @property
    def all_banks(self) -> list[Bank]:
        return [b for banks in self.banks for b in banks]
