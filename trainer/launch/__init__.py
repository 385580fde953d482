"""Processes and ranks: the process group and its collectives (`dist`), the local ranks
`dist.nproc` starts (`spawn`), stop requests and how a stopped run exits (`signals`), how an
error leaves a rank as one line said once (`report`), how the model is spread over ranks
(`strategy`: DDP or FSDP2, as dist.parallelism says), torch.compile (`compile`), and the
test-only faults a run must survive (`fault`).

`signals` and `report` import no torch: the command line uses them before the config is
valid, so that a mistyped value fails in a fraction of a second.

Imports from the trainer: trainer.config, trainer.config_checks, trainer.runtime,
trainer.run_dir.
"""
