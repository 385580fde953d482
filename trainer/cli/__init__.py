"""The command line around a run: what `python train.py` does before and after it (`main`:
errors as one line, from rank 0 alone under torchrun; a stop's command to continue; the
resolved config in the log file), and the overrides checked against the schema and conf/
before Hydra composes them, with what only a multirun does refused without -m (`overrides`;
`keys`: what a dotted key names in the schema, and the keys meant by one it does not;
`sizes`: a size whose experiment has no overlay of its own, said before the run).

Nothing here imports torch when imported (torch comes with the run, once the config is
valid), so a typo on the command line fails in a fraction of a second.

Imports from the trainer: trainer.config, trainer.run_dir, trainer.launch.signals,
trainer.launch.report.
"""
