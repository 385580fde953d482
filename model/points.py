"""The named points of the GPT's forward, and which of the model's parts acts at each.

A mechanism that changes the forward is a part (an nn.Module of its own module, registered on
the GPT) that acts at one of these points; the forward calls whatever part a point holds, and
a point that holds none costs nothing:

    x0_mix            each layer's start: the stream's mix with x0, instead of the shortcut's
                      (model.residual.x0_lambdas: X0Lambdas)
    sublayer_scales   around each sublayer's add (model.residual.sublayer_scales)
    value_gates       inside attention: the value embeddings' gate (ValueGates)
    after_heads       inside attention: each part's `after_heads(y, v, layer)` on the heads'
                      output and their own values, before the gate (XSA)
    after_attention   after each attention sublayer, in order: each part's
                      `after_attention(x, ctx, layer)` (X0Injection, then BigramHash)
    after_layers      after the last layer, instead of the backout (MUDD)

The GPT builds its `Points` once, with its parts (GPT.__init__), and hands them to every layer
beside the forward's `Context`, which holds only what one forward computed. The scalars (the
packed table of the records' scalars, model/scalars.py) are read at every point.
"""

from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class Points:
    """The model's parts by the point of the forward where each acts (module docstring);
    None or () where no part acts there."""

    scalars: nn.Module  # the packed scalar table every point may read (model/scalars.py)
    x0_mix: nn.Module | None = None
    sublayer_scales: nn.Module | None = None
    value_gates: nn.Module | None = None
    after_heads: tuple[nn.Module, ...] = ()
    after_attention: tuple[nn.Module, ...] = ()
    after_layers: nn.Module | None = None
