"""The size axis on the command line: a word when a size has no overlay for the experiment.

`size=toy` (or gpu_toy) applies conf/size/<size>.yaml, which every preset shares, then
conf/preset_size/<size>/<experiment>.yaml, the preset's own shrinking (its width, depth,
tables and stage lengths), where the preset has one. An experiment without one (a user's
own, or a record without a GPU toy) gets the shared part alone: said once, before the run,
so that settings left at the experiment's own are no surprise.
"""

from pathlib import Path


def _last(overrides: list[str], key: str) -> str | None:
    """The value the last `key=value` (or +key=, ++key=) among `overrides` gives, if one
    value (a sweep's comma list is left to each job)."""
    found = None
    for word in overrides:
        name, sep, value = word.lstrip("+").partition("=")
        if sep and name == key:
            found = value
    return None if found is None or "," in found else found


def size_without_overlay(overrides: list[str], conf_dir: Path) -> str | None:
    """The warning for a size below full whose experiment has no overlay of its own; None
    where it has one, or where the command line sets no size or no experiment."""
    size, experiment = _last(overrides, "size"), _last(overrides, "experiment")
    if size in (None, "full") or experiment in (None, "null"):
        return None
    overlay = conf_dir / "preset_size" / size / f"{experiment}.yaml"
    if overlay.is_file():
        return None
    return (
        f"size={size}: experiment={experiment} has no conf/preset_size/{size}/{experiment}.yaml, "
        f"so only what every preset's {size} shares applies (conf/size/{size}.yaml), not a "
        f"shrinking of its own (its tables, stages, steps): add that file for one"
    )
