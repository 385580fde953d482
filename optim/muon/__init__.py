"""Muon's wing: the optimizer (optimizer.py), its one update of a stack of matrices
(update.py), the banks (banks.py, banked.py), the ways a step is distributed (strategies.py,
fsdp_strategies.py, exchange.py), Newton–Schulz and its cost model (newton_schulz.py),
tensor-parallel Newton–Schulz (tp_newton_schulz.py) and the Polar Express schedules
(ns_schedule.py). Its settings are `MuonConfig`, in optim/muon/config.py."""
