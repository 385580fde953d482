"""The role of each parameter of a model, which decides its param group (optim/groups.py).

Muon is meant for the hidden weight matrices only; the token embedding, the LM head and the
small 0-D/1-D parameters (norm gains, biases, scalar lambdas) train better with AdamW at their
own learning rates. A parameter may declare its role itself, as an attribute `role` set by
the module that owns it ("matrix", "embed", "head" or "scalar"; e.g. a merged 3×d×d q/k/v
weight is "matrix": Muon orthogonalises each slice). Otherwise the rule, applied to each
trainable parameter through the module that registers it:

- "scalar": every 0-D or 1-D parameter, wherever it lives (biases of the head included);
- "embed":  2-D parameters of an `nn.Embedding`;
- "head":   2-D parameters of the module named `lm_head` (last component of its qualified name);
- "matrix": every other 2-D parameter (Muon's with optim.name=muon_adamw).

`optim.roles` ({name pattern: role}) overrides both the declared role and the rule for the
parameters its patterns match (record_2026_07_17 steps its 2-D gates with Adam).

Anything else (a 3-D parameter without a declared role, say) fits no group, and a parameter
registered by two modules (weights tied between embedding and head) would fit two; both are
errors that name the parameter, so a new kind of parameter cannot silently go untrained or
be stepped twice.
"""

import fnmatch

from torch import nn

from optim.config import ROLES

Named = list[tuple[str, nn.Parameter]]


def param_roles(model: nn.Module, routes: dict[str, str] | None = None) -> dict[str, Named]:
    """The trainable parameters of `model` by role (see the module docstring): {role:
    [(qualified name, parameter)]} for every role of ROLES, in the model's registration
    order; roles may be empty. `routes`: `optim.roles`, {name pattern: role}."""
    routes = routes or {}
    for pattern, role in routes.items():
        if role not in ROLES:
            raise ValueError(f"optim.roles[{pattern!r}] must be one of {ROLES}, got {role!r}")
    matched: set[str] = set()
    roles: dict[str, Named] = {role: [] for role in ROLES}
    seen: dict[int, str] = {}  # id(param) -> the name it was first found under
    uncovered = []
    for module_name, module in model.named_modules():
        for param_name, p in module.named_parameters(recurse=False):
            if not p.requires_grad:
                continue
            name = f"{module_name}.{param_name}" if module_name else param_name
            if id(p) in seen:
                raise ValueError(
                    f"parameter {name!r} is the same tensor as {seen[id(p)]!r} (tied weights); "
                    "each parameter must belong to exactly one optimizer group, so untie them"
                )
            seen[id(p)] = name
            routed = {pat: r for pat, r in routes.items() if fnmatch.fnmatchcase(name, pat)}
            matched |= routed.keys()
            if len(set(routed.values())) > 1:
                raise ValueError(f"optim.roles: {name!r} matches {routed}, different roles")
            role = next(iter(routed.values())) if routed else _role_of(module_name, module, p)
            if role is None:
                uncovered.append(f"{name} (shape {tuple(p.shape)})")
            else:
                roles[role].append((name, p))
    unmatched = [pat for pat in routes if pat not in matched]
    if unmatched:
        raise ValueError(f"optim.roles: {unmatched} match no trainable parameter")
    if uncovered:
        raise ValueError(
            "no optimizer group takes these parameters (only 0-D/1-D and 2-D parameters are "
            f"handled): {', '.join(uncovered)}"
        )
    return roles


def _role_of(module_name: str, module: nn.Module, p: nn.Parameter) -> str | None:
    role = getattr(p, "role", None)
    if role is not None:
        if role not in ROLES:
            raise ValueError(f"parameter role must be one of {ROLES}, got {role!r}")
        return role
    if p.ndim <= 1:
        return "scalar"
    if p.ndim != 2:
        return None
    if isinstance(module, nn.Embedding):
        return "embed"
    if module_name.rsplit(".", 1)[-1] == "lm_head":
        return "head"
    return "matrix"
