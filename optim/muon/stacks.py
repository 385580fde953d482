"""Which parameters of 3 or more dims Muon steps, and as what: a stack of matrices, named.

Muon orthogonalises the last two dims of a parameter, each leading index its own matrix. That
is right for a stack that is a stack (the merged (3, d, d) W_q, W_k, W_v, the (4, d, d) with
W_o, the (E, out, in) weights of E experts) and wrong for a tensor whose leading dims mean
something else (a convolution's kernel, say). So a parameter of 3 or more dims is stepped only
where it is named a stack, by the attribute `stack_of` (what its leading index runs over):

- the module that owns it declares it (model/attention.py's merged weights, `declare`);
- or `optim.muon.expert_keys` names it by pattern (fnmatch on the qualified name), marking it
  `stack_of = "experts"` when the optimizer is built (`mark_stacks`).

Every expert's matrix then has the LR scale of one expert's (out, in) shape, and is
orthogonalised on its own, batched with the others of its shape.
"""

import fnmatch
from collections.abc import Sequence

from torch import Tensor

EXPERTS = "experts"


def stack_of(p: Tensor) -> str:
    """What the leading dims of `p` index ("" where `p` is not named a stack)."""
    return getattr(p, "stack_of", "")


def check_stack(p: Tensor, name: str = "") -> None:
    """Raise unless `p` is a matrix or a named stack of them, naming the parameter (`name`,
    where known) and the key that names stacks."""
    if p.ndim >= 3 and not stack_of(p):
        what = f"parameter {name!r}" if name else "a parameter"
        raise ValueError(
            f"Muon steps {what} of shape {tuple(p.shape)} as a stack of "
            f"{tuple(p.shape[-2:])} matrices only where it is named one: name expert stacks "
            "in optim.muon.expert_keys (patterns), or set the parameter's `stack_of`, or give "
            "it to AdamW (optim.roles)"
        )


def mark_stacks(named: Sequence[tuple[str, Tensor]], expert_keys: Sequence[str]) -> None:
    """Mark Muon's parameters that `expert_keys` names as expert stacks, then check every
    parameter (`check_stack`); a pattern that names a parameter of fewer than 3 dims is an
    error, as a stack of one expert is no stack."""
    for name, p in named:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in expert_keys):
            if p.ndim < 3:
                raise ValueError(
                    f"optim.muon.expert_keys names {name!r}, of shape {tuple(p.shape)}: an "
                    "expert stack is (E, out, in); leave the pattern off it"
                )
            p.stack_of = EXPERTS  # type: ignore[attr-defined]
        check_stack(p, name)


def is_expert_stack(p: Tensor) -> bool:
    """Whether `p` holds one matrix per expert."""
    return stack_of(p) == EXPERTS
