"""The GPT model and its config."""

from model.config import ModelConfig
from model.gpt import GPT

__all__ = ["GPT", "ModelConfig"]
