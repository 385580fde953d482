"""The GPT (model/gpt.py) and its config (model/config/).

`GPT` is imported on first use (PEP 562), so that reading the config schema does not import
torch: a command-line typo then fails in a fraction of a second.
"""

from typing import Any

from model.config import ModelConfig

__all__ = ["GPT", "ModelConfig"]


def __getattr__(name: str) -> Any:
    if name == "GPT":
        from model.gpt import GPT

        return GPT
    raise AttributeError(f"module 'model' has no attribute {name!r}")
