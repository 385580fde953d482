"""A public run's validation curve (`train.reference`), and from it the time this run needs to
reach a target loss.

A curve is a CSV of the public run's evaluations (scripts/reference/, whose README names each
file's source): `step`, `val_loss`, and the cumulative training `tokens` where the run's
tokens per step changed by stage (else step × 524,288, the first records' batch). Runs are
matched by tokens, not steps or time, so a run of another batch schedule or on other hardware
still reads the curve right.

A curve fits only the run it describes: a `# run:` line in its CSV names its corpus and model
(`# run: data=fineweb n_layer=11 n_embd=768`), and a run that differs in any of them (a record
preset at toy size, or on the embedded sample) is not shown the curve (`misfit`): its loss at
those tokens and a time to a target the run cannot reach would only mislead. A CSV without the
line is shown to any run.

The estimate at an evaluation of loss v after this run's T tokens: the curve's tokens T(v)
where it first had loss v, and T(target) where it first reached the target; the run needs
about T(target) − T(v) more tokens (it is where the curve was at T(v), and goes on as the
curve went on), at its own measured seconds per token.
"""

import bisect
import csv
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

CURVES_DIR = Path(__file__).resolve().parents[1] / "scripts" / "reference"
DEFAULT_TOKENS_PER_STEP = 524_288  # 8 GPUs × 64 sequences × 1,024 tokens


@dataclass
class ReferenceConfig:
    """The `train.reference` group: which public curve a run is measured against."""

    curve: str = ""
    """A curve's file stem in scripts/reference/ or a CSV path; "" = none. With a curve, each
    evaluation logs the time to `target` estimated from it (`target_eta_s`)."""
    target: float = 3.28
    """The loss the estimate aims at (the speedrun's FineWeb bar). A curve that never got
    there gives no estimate (record #21's logged run ended at 3.2808)."""

    def validate(self) -> None:
        if self.curve:
            curve_path(self.curve)  # raises naming the key
        if self.target <= 0:
            raise ValueError(f"train.reference.target must be positive, got {self.target}")


def curve_names() -> list[str]:
    return sorted(p.stem for p in CURVES_DIR.glob("*.csv"))


def curve_path(name: str) -> Path:
    path = Path(name).expanduser() if name.endswith(".csv") else CURVES_DIR / f"{name}.csv"
    if not path.is_file():
        raise ValueError(
            f"train.reference.curve={name!r}: no such curve; give a CSV path or one of "
            f"{curve_names()}"
        )
    return path


@dataclass(frozen=True)
class Curve:
    """A public run's evaluations, in step order."""

    name: str
    steps: tuple[int, ...]
    tokens: tuple[int, ...]
    val_loss: tuple[float, ...]
    train_time_ms: tuple[float | None, ...]
    run: tuple[tuple[str, str], ...] = ()  # the `# run:` line's (key, value) pairs

    @property
    def tokens_per_step(self) -> int:
        """The last evaluation's mean tokens per step (the per-step batch of a one-stage run)."""
        return self.tokens[-1] // self.steps[-1] if self.steps[-1] else DEFAULT_TOKENS_PER_STEP

    def tokens_at(self, loss: float) -> float | None:
        """The tokens at which the curve first reached `loss`, interpolated linearly between
        its evaluations; 0 for a loss above its first one; None if it never got that low."""
        if loss >= self.val_loss[0]:
            return 0.0
        for i in range(1, len(self.val_loss)):
            if self.val_loss[i] <= loss:
                a, b = self.val_loss[i - 1], self.val_loss[i]
                frac = (a - loss) / (a - b)
                return self.tokens[i - 1] + frac * (self.tokens[i] - self.tokens[i - 1])
        return None

    def loss_at_tokens(self, tokens: float) -> float:
        """The curve's loss after `tokens`, interpolated (its last loss past its end)."""
        i = bisect.bisect_right(self.tokens, tokens)
        if i >= len(self.tokens):
            return self.val_loss[-1]
        a, b = self.tokens[i - 1], self.tokens[i]
        return self.val_loss[i - 1] + (tokens - a) / (b - a) * (
            self.val_loss[i] - self.val_loss[i - 1]
        )

    def tokens_to(self, target: float, loss: float) -> float | None:
        """The tokens the curve took from where it had `loss` to `target` (0 once there);
        None when it never reached the target."""
        if loss <= target:
            return 0.0
        end = self.tokens_at(target)
        return None if end is None else end - (self.tokens_at(loss) or 0.0)


def load_curve(name: str) -> Curve:
    """The curve `name` (a file stem in scripts/reference/ or a CSV path)."""
    path = curve_path(name)
    lines = path.read_text().splitlines()
    rows = [line for line in lines if not line.startswith("#")]
    run = next((x.split(":", 1)[1].split() for x in lines if x.startswith("# run:")), [])
    if any("=" not in pair for pair in run):
        raise ValueError(f"{path}: its '# run:' line must be key=value pairs, got {run}")
    steps, tokens, losses, times = [], [], [], []
    for row in csv.DictReader(rows):
        steps.append(int(row["step"]))
        losses.append(float(row["val_loss"]))
        tokens.append(
            int(row["tokens"]) if row.get("tokens") else steps[-1] * DEFAULT_TOKENS_PER_STEP
        )
        times.append(float(row["train_time_ms"]) if row.get("train_time_ms") else None)
    if len(steps) < 2 or any(b <= a for a, b in pairwise(tokens)):
        raise ValueError(f"{path}: a curve needs 2 or more evaluations in token order")
    pairs = tuple(tuple(pair.split("=", 1)) for pair in run)
    return Curve(path.stem, tuple(steps), tuple(tokens), tuple(losses), tuple(times), pairs)


def run_facts(data: Any, model: Any) -> dict[str, str]:
    """What a curve's `# run:` line is compared with, for a run of `data` and `model` (the
    config's groups): its corpus (FineWeb where its shards are named so) and its shape."""
    corpus = data.source
    if corpus == "shards" and "fineweb" in f"{data.dir} {data.val_files}".lower():
        corpus = "fineweb"
    return {"data": corpus, "n_layer": str(model.n_layer), "n_embd": str(model.n_embd)}


def misfit(curve: Curve, facts: dict[str, str]) -> str | None:
    """Why `curve` does not describe a run of `facts` (`run_facts`), or None when it does."""
    differ = [(k, v) for k, v in curve.run if k in facts and facts[k] != v]
    if not differ:
        return None
    theirs = ", ".join(f"{k}={v}" for k, v in differ)
    ours = ", ".join(f"{k}={facts[k]}" for k, _ in differ)
    return f"it was measured at {theirs}, this run has {ours}"


def target_eta_s(
    curve: Curve, target: float, loss: float, seconds_per_token: float
) -> float | None:
    """Seconds to `target` from an evaluation of `loss` (module docstring); None when the
    curve never reached the target."""
    more = curve.tokens_to(target, loss)
    return None if more is None else more * seconds_per_token
