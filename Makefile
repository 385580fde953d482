# Two commands from a fresh machine (Python >= 3.10 with venv):
#   make train   -> builds .venv, the sample corpus, and trains the default model
#   make test    -> builds .venv and runs the test suite (both tiers, on 2 cores)
# make test-unit runs the fast tier alone (tests/unit), for the edit-test loop.
# Extra Hydra overrides for train: make train ARGS="optim=adamw train.steps=100"
# TORCH picks the torch build installed first; the default is the CPU-or-local 2.13.0 wheel.
# On a GPU machine use e.g. TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128".

PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
ARGS ?=

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-unit test-emulated-bf16 lint bench dryrun clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "== installing $(TORCH) into $(VENV) (the CUDA build is several GB; see README)"
	$(BIN)/python -m pip install $(TORCH)
	@echo "== installing the project and its dependencies (pyproject.toml) with uv (~10x pip's speed)"
	$(BIN)/python -m pip install "uv>=0.9,<1"
	$(BIN)/uv pip install --python $(BIN)/python ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=15

test-unit: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests/unit

# The unit tests whose path depends on the CPU's bf16, with torch held to AVX2 (bf16 emulated,
# as on an AVX2-only CPU): .ci/run adds this on a CPU with native bf16. Not the slow ones: the one
# slow unit test (Muon's batched record forms, ~25 s emulated) asks for bf16 whatever the CPU,
# so it takes no other path; on an AVX2-only CPU the main pass runs it emulated anyway.
test-emulated-bf16: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 $(BIN)/python -m pytest -q -n 2 -m "cpu_bf16 and not slow" tests/unit

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: $(STAMP)
	$(BIN)/python scripts/bench/muon_step.py

# A GPU's compile of record #89's step on this CPU (scripts/gpu_dryrun, docs/gpu.md), with the
# Triton of the H100s' torch 2.11; then tests/unit/test_gpu_dryrun.py runs rather than skips.
TRITON ?= triton==3.6.0
dryrun: $(STAMP)
	$(BIN)/python -m pip install "$(TRITON)"
	$(BIN)/python -m scripts.gpu_dryrun $(ARGS)

clean-venv:
	rm -rf $(VENV)
