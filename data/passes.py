"""Passes over the training data: a wrap is announced when it happens, and a run is checked
before it starts against what its data can serve.

A loader reaches the end of its last shard and starts again from the first: from then on
every batch repeats text the model has already trained on. That is legitimate (several epochs
of a small corpus) but it must never be silent, because a falling training loss then measures
memorisation. So the loader counts the tokens it serves in each pass (`Passes`, part of its
checkpoint state), logs one warning per wrap, and the trainer writes the pass number (`epoch`)
into every step's record. Before the first step, `plan_passes` walks a copy of the loader
through the run's remaining steps, cutting each batch's index but reading no tokens, and
finds the step at which the data would first wrap.
"""

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class Passes:
    """The tokens (all ranks together) served in the current pass over the shards."""

    def __init__(self, announce: bool) -> None:
        self.announce = announce  # one rank logs the wrap
        self.tokens = 0

    def served(self, tokens: int) -> None:
        self.tokens += tokens

    def wrapped(self, epoch: int, shards: int) -> None:
        """The loader went back to its first shard: pass `epoch` (0-based) begins."""
        if self.announce:
            log.warning(
                "the training data wrapped around: pass %d begins (epoch %d in "
                "metrics.jsonl) after %s distinct tokens from %d shard(s); every batch from "
                "here repeats text already trained on",
                epoch + 1, epoch, f"{self.tokens:,}", shards,
            )  # fmt: skip
        self.tokens = 0

    def state(self) -> dict[str, int]:
        return {"pass_tokens": self.tokens}

    def load(self, state: dict[str, Any]) -> None:
        # A save from before the count resumes with the pass counted from here.
        self.tokens = int(state.get("pass_tokens", 0))


@dataclass(frozen=True)
class PassPlan:
    """What a run's remaining steps read from its data."""

    steps: int  # the steps planned
    tokens: int  # the tokens they read, all ranks together
    wrap_step: int | None  # the first step (1-based) whose batch comes from a new pass
    pass_tokens: int  # the tokens of the pass that ends there (0 when none ends)

    @property
    def passes(self) -> float:
        """How many passes over the data the run makes (1 when it never wraps)."""
        return self.tokens / self.pass_tokens if self.wrap_step is not None else 1.0

    def warning(self, source: str) -> str | None:
        """One line for the log when the run wraps its data; None when it does not."""
        if self.wrap_step is None:
            return None
        return (
            f"the run's {self.steps} steps read {self.tokens:,} training tokens, but {source} "
            f"serves {self.pass_tokens:,} per pass: the data wraps around at step "
            f"{self.wrap_step} and is read {self.passes:.1f} times, so the training loss "
            "falls partly by memorisation (watch the validation loss). More data or fewer "
            "train.steps avoid it; each wrap is logged and metrics.jsonl carries the pass "
            "as `epoch`"
        )


def plan_passes(loader: Any, steps: Iterable[tuple[int, dict[str, int]]]) -> PassPlan:
    """Walk a copy of `loader` (its `advance` cuts a batch without reading it) through
    `steps`, each (tokens per sequence, the loader's keyword arguments) for one step from
    where the loader stands, and report where it first wraps. The loader is untouched.

    A loader error on the way (a batch its data cannot cut) ends the plan there: the run
    itself raises it at that step, with its message.
    """
    shadow = copy.copy(loader)  # positions are ints, shards and their indexes are shared
    shadow.passes = Passes(announce=False)
    shadow.passes.tokens = loader.passes.tokens
    epoch, tokens, planned, wrap_step, pass_tokens = loader.epoch, 0, 0, None, 0
    for step, (seq_len, args) in enumerate(steps, start=1):
        before = shadow.passes.tokens
        try:
            shadow.advance(seq_len, **args)
        except ValueError:
            break
        planned, tokens = step, tokens + loader.batch_size * seq_len
        if wrap_step is None and shadow.epoch != epoch:
            wrap_step, pass_tokens = step, before
    return PassPlan(planned, tokens, wrap_step, pass_tokens)
