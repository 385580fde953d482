"""What a run reports: the step records (`metrics`), the startup and step lines (`console`),
Weights & Biases
(`wandb_log`), where the run is and what it has cost (`progress`), the code it ran
(`provenance`), its MFU (`flops`), what bf16 costs on this CPU (`cpu_cost`) and a multirun's
last line (`sweep_summary`). Observing changes nothing in the run.

Imports from the trainer: trainer.config, trainer.runtime.
"""
