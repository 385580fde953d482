"""How a run spreads over ranks, named by one key, `dist.parallelism`: where each gradient is
reduced, which rank steps which rows, and how the new rows reach every rank. The update itself
is the same in all of them (optim/muon/update.py, optim/adam_update.py); only the exchange
around it differs.

Only the arrangements that work are named, so no combination of settings has to be refused.
The four keys this one replaced (dist.strategy, optim.distribute, optim.muon.exchange,
optim.muon.sharded_ns) fail with one line naming it (`replaced_message`), and a saved config
that has them reads as today's (`from_replaced`, through the resume rules' `upgrade_saved`).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Parallelism:
    """One value of `dist.parallelism`."""

    fsdp: bool
    """The parameters, gradients and optimizer state are FSDP2 dim-0 shards (else every rank
    holds the whole model, DDP-wrapped)."""
    muon: str
    """Muon's exchange: all_gather | all_reduce (DDP averages the gradients, round-robin
    owners orthogonalise, the updates are shared; optim/muon/exchange.py) | reduce_scatter
    (Muon's gradients skip DDP and are reduced to their owners) | rows (the optimizer
    reduces every gradient and steps its rows' share of each bank and table) | gather (FSDP
    shards to an owner and back) | tp (FSDP shards orthogonalised tensor-parallel, in
    place)."""
    summary: str


PARALLELISMS = {
    "ddp_all_gather": Parallelism(False, "all_gather", (
        "DDP all-reduces every gradient; each rank orthogonalises its round-robin share of "
        "Muon's matrices and an all-gather hands every rank the rest (optim/muon/exchange.py)"
    )),
    "ddp_all_reduce": Parallelism(False, "all_reduce", (
        "as ddp_all_gather, the updates shared by one all-reduce of zero-filled buffers "
        "(twice the bytes; for backends without an all-gather of every dtype)"
    )),
    "ddp_owners": Parallelism(False, "reduce_scatter", (
        "Muon's gradients skip DDP: reduce-scattered to their owners, which alone keep their "
        "momentum, then the new matrices all-gathered (gradient reduction and exchange in the "
        "bytes of DDP's all-reduce)"
    )),
    "ddp_row_shards": Parallelism(False, "rows", (
        "every gradient skips DDP: the optimizer reduce-scatters them, each rank steps 1/W of "
        "the rows of Muon's banks and of Adam's large tables (and holds their state), and the "
        "new rows are all-gathered (optim/ddp_rows.py); checkpoints stay whole"
    )),
    "fsdp_gather": Parallelism(True, "gather", (
        "FSDP2 shards parameters, gradients and optimizer state by dim-0 rows; Muon sends each "
        "matrix's shards to an owner, which orthogonalises it and sends the rows back "
        "(optim/muon/fsdp_strategies.py); checkpoints are DCP"
    )),
    "fsdp_tp": Parallelism(True, "tp", (
        "FSDP2 as fsdp_gather; Muon orthogonalises the row shards tensor-parallel, in place "
        "(optim/muon/tp_newton_schulz.py)"
    )),
}  # fmt: skip
NAMES = tuple(PARALLELISMS)
DEFAULT = "ddp_all_gather"
# The ones where Muon runs its own exchange over DDP's ranks (optim/muon/strategies.py)
MUON_EXCHANGES = ("ddp_all_gather", "ddp_all_reduce", "ddp_owners")

# The keys `dist.parallelism` replaced: dotted key -> {its value: the parallelism it meant}
REPLACED = {
    "dist.strategy": {"ddp": "ddp_all_gather", "fsdp": "fsdp_gather"},
    "optim.distribute": {"replicated": "ddp_all_gather", "sharded": "ddp_row_shards"},
    "optim.muon.exchange": {"all_gather": "ddp_all_gather", "all_reduce": "ddp_all_reduce",
                            "reduce_scatter": "ddp_owners"},
    "optim.muon.sharded_ns": {"gather": "fsdp_gather", "tp": "fsdp_tp"},
}  # fmt: skip


def replaced_message(key: str) -> str:
    """The one line for `key`, a dotted key of REPLACED."""
    meant = ", ".join(f"{key}={old} is {new}" for old, new in REPLACED[key].items())
    return (
        f"{key} is now dist.parallelism, one key for how the run spreads over ranks ({meant}; "
        "docs/config.md)"
    )


def replaced_within(key: str) -> str | None:
    """The replaced key that dotted `key` is, or None."""
    return key if key in REPLACED else None


def from_replaced(saved: dict[str, str]) -> str:
    """The parallelism a config saved with the replaced keys ran: `saved` holds their values by
    dotted key (any may be absent, as their defaults were). FSDP decided Muon's sharded form;
    under DDP the optimizer's row shards replaced Muon's own exchange."""
    if saved.get("dist.strategy", "ddp") == "fsdp":
        return "fsdp_tp" if saved.get("optim.muon.sharded_ns") == "tp" else "fsdp_gather"
    if saved.get("optim.distribute", "replicated") == "sharded":
        return "ddp_row_shards"
    return REPLACED["optim.muon.exchange"][saved.get("optim.muon.exchange", "all_gather")]


def check_replicate(replicate: int, parallelism: str, ranks: int | None) -> None:
    """Raise ValueError naming dist.replicate where HSDP's (R, W/R) mesh can't be laid out:
    R < 1, R > 1 without an fsdp parallelism, or R not dividing the `ranks` (None: not known
    yet, as under torchrun before launch)."""
    if replicate < 1:
        raise ValueError(f"dist.replicate must be >= 1, got {replicate}")
    if replicate > 1 and not PARALLELISMS[parallelism].fsdp:
        raise ValueError(
            f"dist.replicate={replicate} replicates FSDP's shard groups (HSDP): it needs an "
            f"fsdp dist.parallelism (fsdp_gather, fsdp_tp), not {parallelism}"
        )
    if ranks is not None and ranks % replicate:
        raise ValueError(f"dist.replicate={replicate} must divide the ranks, {ranks} here")


def check_tensor_parallel(size: int, replicate: int, parallelism: str, ranks: int | None) -> None:
    """Raise ValueError naming dist.tensor_parallel where its (…, W/T, T) mesh can't be laid
    out: T < 1, T > 1 without fsdp_gather (the one exchange that takes a TP rank's blocks of
    rows and columns), or T·dist.replicate not dividing the `ranks` (None: not known yet)."""
    if size < 1:
        raise ValueError(f"dist.tensor_parallel must be >= 1, got {size}")
    if size > 1 and parallelism != "fsdp_gather":
        raise ValueError(
            f"dist.tensor_parallel={size} needs dist.parallelism=fsdp_gather (FSDP2 beside "
            f"it; Muon's exchange takes its blocks), not {parallelism}"
        )
    if ranks is not None and ranks % (size * replicate):
        raise ValueError(
            f"dist.tensor_parallel={size} × dist.replicate={replicate} must divide the ranks, "
            f"{ranks} here"
        )
