"""Checkpoints: what one holds and how every rank takes part in saving and resuming it
(`checkpointer`, with the state it gathers in `state`, the two layouts in `layouts` and its
log lines in `report`), when a run saves (`when`), the files on disk and their atomic commit
(`files`), the sharded tensors through Distributed Checkpoint (`dcp_state`), and how a resume
treats the saved config (`resume_rules`).

Imports from the trainer: trainer.config, trainer.config_checks, trainer.runtime,
trainer.launch.dist (the collectives every rank saves and resumes through),
trainer.observe.progress (the loop's position, saved) and trainer.observe.provenance (the
code's version, recorded).
"""
