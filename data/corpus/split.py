"""Which documents of a corpus are held out for validation: one rule for every corpus tool."""

import math


def is_val(index: int, val_fraction: float) -> bool:
    """Whether document `index` (0-based, in input order) is a validation document.

    Document i is held out when (i + 1) · val_fraction crosses an integer: spread evenly through
    the input, about val_fraction of all documents, the same on every machine and for any
    number of worker processes.
    """
    return math.floor((index + 1) * val_fraction) > math.floor(index * val_fraction)
