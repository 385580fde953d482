"""Which `Strategy` runs Muon under each dist.parallelism (optim/parallelism.py), and what a
setting needs of it: the one place a parallelism's name becomes Muon's exchange."""

import functools

import torch
import torch.distributed as dist

from optim.config import MuonConfig
from optim.muon.batches import ns_runs
from optim.muon.fsdp_strategies import ShardedOwners, ShardedTP
from optim.muon.strategies import NewtonSchulz, OwnerOnly, Replicated, Strategy
from optim.parallelism import MUON_EXCHANGES, PARALLELISMS


def strategy_for(
    parallelism: str, group: dist.ProcessGroup | None, hp: MuonConfig, ns: NewtonSchulz,
    ns_dtype: torch.dtype,
) -> Strategy:  # fmt: skip
    """The strategy of `parallelism` over `group`'s ranks (one process: `Strategy` itself);
    ValueError naming the setting where `hp` needs whole matrices the parallelism splits."""
    several = group is not None and dist.get_world_size(group) > 1
    exchange = PARALLELISMS[parallelism].muon
    sharded = PARALLELISMS[parallelism].fsdp
    whole = {"normuon_beta2": hp.normuon_beta2 > 0,
             "master_weights": hp.master_weights != "none",
             "qk_split": hp.qk_split != "none"}  # fmt: skip
    for key, on in whole.items():
        if on and (sharded or (several and exchange == "reduce_scatter")):
            # NorMuon's statistics, the master's low half and the head-pair blocks need
            # each whole update where it is applied, with its state there for checkpoints:
            # only the replicated exchanges (and the row shards' whole banks) give that.
            raise ValueError(
                f"optim.muon.{key}={getattr(hp, key)} runs in one process or with "
                f"dist.parallelism=ddp_all_gather | ddp_all_reduce | ddp_row_shards; got "
                f"dist.parallelism={parallelism}"
            )
    if hp.exchange_overlap != "auto" and exchange not in ("all_gather", "all_reduce"):
        raise ValueError(
            f"optim.muon.exchange_overlap={hp.exchange_overlap} times the round-robin exchange "
            f"of dist.parallelism=ddp_all_gather | ddp_all_reduce; got dist.parallelism="
            f"{parallelism}: leave it auto"
        )
    if not hp.free_grads and not sharded:
        raise ValueError(
            "optim.muon.free_grads=false keeps the gradients an fsdp dist.parallelism frees "
            f"during the step; got dist.parallelism={parallelism}, which keeps them anyway: "
            "leave it true"
        )
    if sharded:
        if exchange == "tp":
            return ShardedTP(ns, ns_dtype, hp)
        return ShardedOwners(ns, ns_dtype, hp.exchange_in_flight, hp.exchange_chunk,
                             hp.free_grads)  # fmt: skip
    if group is None or dist.get_world_size(group) == 1:
        return Strategy(ns)
    if parallelism not in MUON_EXCHANGES:
        raise ValueError(
            f"dist.parallelism={parallelism} shares Muon's rows through the optimizer's "
            "exchange (`comm`), not a process group"
        )
    if exchange == "reduce_scatter":
        return OwnerOnly(ns, group)
    runs = functools.partial(ns_runs, form=hp.ns_form)  # what an overlapped exchange goes by
    return Replicated(ns, group, exchange, ns_dtype, hp.exchange_overlap, runs)
