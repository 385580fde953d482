"""The trainer: a validated config in, a trained model and its records out.

The centre holds the loop and what every room shares. The loop: `build` builds a run from its
config (for training and every tool that steps a run), `session` wires one training run around
it, `loop` steps through it, `train_step` is one optimizer step, `forward` runs batches through
the model, `schedule` gives every step-dependent value and `nonfinite` guards a step against
NaN/inf. What every room shares: the run's config schema (`config`, with the checks its values
pass in `config_checks`, and those across groups in `config_across`), where the run executes
(`runtime`: device, ranks, precision, seeding), the run directory it writes to (`run_dir`) and
the public curve it is measured against (`reference`, a group of the schema). The schema lives
here rather than in the command-line room because every room reads it, and what every room
shares imports no room.

Shared by every room: trainer.config, trainer.config_checks, trainer.config_across,
trainer.runtime, trainer.run_dir, trainer.reference.

The rooms, each a sub-package whose docstring names what it may import from the trainer:
`checkpoint` (saving and resuming), `launch` (processes, ranks, signals, wrapping),
`observe` (what a run reports) and `cli` (the command line around a run). No room imports
the loop's modules; only the loop's modules and `train.py` put the rooms together.
"""
