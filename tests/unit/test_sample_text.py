"""scripts/sample.py's pieces: generation crops its context and samples real tokens, and a
window model gets its final evaluation's window (runs: tests/e2e/test_sample_runs.py)."""

from pathlib import Path

import torch

from data.tokenizer import EOT, GPT2_VOCAB_SIZE
from model import GPT, ModelConfig
from model.config import update
from scripts.sample import forward_args, generate, model_config
from trainer.checkpoint.resume_rules import upgrade_saved

REPO = Path(__file__).resolve().parents[2]
SEQ_LEN = 64  # train.seq_len in TINY: generating more than this exercises the context crop


class Scripted(torch.nn.Module):
    """Logits (B, T, 50304) that favour a padding token most, then the real token T mod 7;
    records every context it is given."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[list[int]] = []

    def forward(self, idx: torch.Tensor, last: bool = False) -> torch.Tensor:
        self.seen.append(idx[0].tolist())
        logits = torch.zeros(*idx.shape, 50304)
        logits[..., 50300] = 100.0  # a padding row of the head: never a real token
        logits[..., idx.shape[1] % 7] = 10.0
        return logits[:, -1:] if last else logits


def test_generate_crops_the_context_and_samples_real_tokens_only() -> None:
    model, prompt = Scripted(), torch.tensor([[EOT, 100, 101, 102, 103]])
    gen = torch.Generator().manual_seed(0)
    out = generate(model, prompt, 6, 1.0, 1, gen, context=4, model_args={})[0].tolist()
    assert out == [*prompt[0].tolist(), *[4] * 6]  # greedy over a context of 4: token 4
    assert model.seen == [out[:n][-4:] for n in range(5, 11)]
    out = generate(Scripted(), prompt, 50, 1.0, 0, gen, context=4, model_args={})
    assert (out < GPT2_VOCAB_SIZE).all()


def test_window_models_get_the_last_steps_window() -> None:
    """The final evaluation's window, from the run's schedule; a save from before the window
    moved into the model config (optim.schedule.window_tokens) reads the same."""
    model = GPT(
        update(
            ModelConfig(n_layer=2, n_embd=64),
            {"attention.window": "LS", "attention.window_tokens": 48},
        )
    ).eval()
    args = forward_args(model, {"train": {"steps": 10}}, torch.device("cpu"))
    assert args["window_tokens"].dim() == 0 and args["window_tokens"].item() == 48
    plain = GPT(ModelConfig(n_layer=2, n_embd=64)).eval()
    assert forward_args(plain, {"train": {"steps": 10}}, torch.device("cpu")) == {}
    old = {"model": {"n_layer": 2, "n_embd": 64, "window": "LS"},
           "optim": {"schedule": {"window_tokens": 48}}}  # fmt: skip
    assert model_config(upgrade_saved(old)["model"], Path(".")) == model.cfg
    out = generate(model, torch.tensor([[EOT]]), 3, 1.0, 0, torch.Generator(), 16, args)
    assert out.shape == (1, 4)
