"""Per-tensor Adam settings (`optim.adamw.table`, record_2026_07_17's D.3 table): which row each
Adam parameter takes.

A row gives the parameters whose qualified names its pattern matches (fnmatch, as
`optim.lr_mul`) a factor on their group's LR, their own betas and a factor on the weight
decay (`AdamRow`, optim/config.py); optim/adam.py applies them. The table is strict, so that
a renamed parameter cannot silently fall back to the group's settings: every pattern must
match a parameter Adam steps; a parameter matched by two patterns is an error (no
order-dependent first match), and so are a pattern that matches a parameter of Muon (route it
to an Adam role with `optim.roles` first) and a parameter that `optim.lr_mul` also scales (its
LR factor would be given in two places). Parameters no pattern matches keep the group's
settings (factors 1, optim.adamw's betas).

A parameter may carry its own row: its part declares `optim_settings` on it (lr_mul, beta1,
beta2, wd_mul; model/config/param_optim.py, set from the part's config section, e.g.
`model.bigram.optim`). Those settings travel with the parameter, so its row needs no
pattern; a pattern of the table, or of `optim.lr_mul`, that also matches it is an error
(its settings would be given in two places). Declared settings equal to the group's own
(all defaults) are no row.
"""

import fnmatch
from dataclasses import dataclass

from optim.config import AdamWConfig, OptimConfig
from optim.partition import Named


@dataclass(frozen=True)
class Row:
    """A parameter's resolved row: the pattern that matched it and its settings."""

    pattern: str
    lr_mul: float
    betas: tuple[float, float]
    wd_mul: float


def resolve_table(adam: Named, others: Named, cfg: OptimConfig) -> dict[str, Row]:
    """{parameter name: Row} for the Adam parameters `adam` that a pattern of
    `cfg.adamw.table` matches; `others`: the parameters of the other optimizers (Muon's),
    which no pattern may match. Raises ValueError naming the `optim.adamw.table` key."""
    for name, p in others:
        if _declared(name, p, cfg) is not None:
            raise ValueError(
                f"{name!r} declares its own Adam settings, but Muon steps it: route it to an "
                "Adam role with optim.roles, or leave its section's optim settings at default"
            )
    table = cfg.adamw.table
    declared = {name: _declared(name, p, cfg) for name, p in adam}
    rows = {name: row for name, row in declared.items() if row is not None}
    if not table:
        return rows
    key = "optim.adamw.table"
    for name, _ in others:
        hits = [pat for pat in table if fnmatch.fnmatchcase(name, pat)]
        if hits:
            raise ValueError(
                f"{key}[{hits[0]!r}] matches {name!r}, which Adam does not step: route it to an "
                "Adam role with optim.roles, or narrow the pattern"
            )
    matched = set()
    for name, _ in adam:
        hits = [pat for pat in table if fnmatch.fnmatchcase(name, pat)]
        matched.update(hits)
        if hits and name in rows:
            raise ValueError(
                f"{key}[{hits[0]!r}] matches {name!r}, whose part declares its own Adam "
                "settings (its section's `optim`, e.g. model.bigram.optim): set them there"
            )
        if len(hits) > 1:
            raise ValueError(f"{key}: {name!r} matches {hits}; each parameter takes one row")
        if not hits:
            continue
        scaled = [pat for pat in cfg.lr_mul if fnmatch.fnmatchcase(name, pat)]
        if scaled:
            raise ValueError(
                f"{key}[{hits[0]!r}] and optim.lr_mul[{scaled[0]!r}] both match {name!r}: give "
                "its LR factor in the table only"
            )
        rows[name] = row_of(hits[0], cfg.adamw)
    unmatched = [pat for pat in table if pat not in matched]
    if unmatched:
        raise ValueError(f"{key}: {unmatched} match no parameter that Adam steps")
    return rows


def _declared(name: str, p: object, cfg: OptimConfig) -> Row | None:
    """The row that parameter `name` declares itself (`optim_settings`), None when it
    declares none or only the group's own settings."""
    own = getattr(p, "optim_settings", None)
    if own is None or (own.lr_mul, own.beta1, own.beta2, own.wd_mul) == (1.0, None, None, 1.0):
        return None
    scaled = [pat for pat in cfg.lr_mul if fnmatch.fnmatchcase(name, pat)]
    if scaled:
        raise ValueError(
            f"optim.lr_mul[{scaled[0]!r}] matches {name!r}, whose part declares its own Adam "
            "settings: give its LR factor there"
        )
    a = cfg.adamw
    beta1 = a.beta1 if own.beta1 is None else own.beta1
    beta2 = a.beta2 if own.beta2 is None else own.beta2
    return Row(f"{name} (its own)", own.lr_mul, (beta1, beta2), own.wd_mul)


def row_of(pattern: str, settings: AdamWConfig) -> Row:
    """The resolved row of `pattern`: its unset betas are `settings`'."""
    row = settings.table[pattern]
    beta1 = settings.beta1 if row.beta1 is None else row.beta1
    beta2 = settings.beta2 if row.beta2 is None else row.beta2
    return Row(pattern, row.lr_mul, (beta1, beta2), row.wd_mul)


def describe_table(rows: dict[str, Row]) -> str:
    """The table as the startup log prints it, below the groups: each pattern's LR factor,
    betas, decay factor and the parameters it matched."""
    by_pattern: dict[Row, list[str]] = {}
    for name, row in rows.items():
        by_pattern.setdefault(row, []).append(name)
    lines = [("Adam table", "lr x", "betas", "wd x", "tensors")]
    for row, names in by_pattern.items():
        betas = f"({row.betas[0]:g}, {row.betas[1]:g})"
        lines.append((row.pattern, f"{row.lr_mul:g}", betas, f"{row.wd_mul:g}", str(len(names))))
    widths = [max(len(r[k]) for r in lines) for k in range(len(lines[0]))]
    return "\n".join("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in lines)  # fmt: skip
