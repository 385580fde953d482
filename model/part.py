"""A part: one mechanism's nn.Module, registered on the GPT by one line of `GPT.__init__`.

A part declares what the rest of the model needs from it, so nothing else names it:
- `reset()`: draws its parameters (model/init.py calls every part's, in the order the GPT
  registers them: that order is the RNG stream's, so a part that draws is registered last);
- `fsdp_units()`: the modules of it FSDP2 shards as units of their own (`GPT.fsdp_units`;
  none by default: it stays in the root unit);
- `cast_bf16()`: what it holds in bf16 when model.numerics.dtype=bf16 (nothing by default);
and it acts at one of the forward's named points (model/points.py).
"""

from abc import ABC, abstractmethod

from torch import nn


class Part(nn.Module, ABC):
    """The base of every part (module docstring): a part without `reset` cannot be built."""

    @abstractmethod
    def reset(self) -> None:
        """Draw (or set) the part's parameters in place."""

    def fsdp_units(self) -> list[nn.Module]:
        return []

    def cast_bf16(self) -> None:
        return None
