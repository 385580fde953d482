# Two commands from a fresh machine (Python >= 3.10 with venv), on a CPU or a GPU machine alike:
#   make train   -> builds .venv, the sample corpus, and trains the default model in outputs/first
#   make test    -> builds .venv and runs the test suite (both tiers, on 2 cores)
# make test-unit runs the fast tier alone (tests/unit), for the edit-test loop.
# Extra Hydra overrides for train: make train ARGS="optim=adamw train.steps=100" (a run with
# ARGS gets its own outputs/<date>/<time>/ unless RUN=DIR names one).
# Rerunning `make train` continues outputs/first where it stopped (a finished run returns at once).

PYTHON ?= python3
VENV ?= .venv
TORCH_VERSION ?= 2.13.0
ARGS ?=
# The default run's directory when no ARGS are given, so that README's "First hour" finds it
RUN ?= $(if $(ARGS),,outputs/first)

# TORCH: the torch build installed first, by default the one that fits this machine. On Linux,
# PyPI's torch wheel is the CUDA build (several GB), right where nvidia-smi answers and
# useless without a GPU, where PyTorch's CPU index has the CPU build; elsewhere (macOS) PyPI's
# wheel is the CPU build. Name another to override, e.g. for CUDA 12.8:
#   make train TORCH="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
HAS_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAS_GPU),yes)
TORCH ?= torch==$(TORCH_VERSION)
TORCH_WHY := an NVIDIA GPU answers (nvidia-smi): the CUDA build, several GB
else ifeq ($(shell uname -s),Linux)
TORCH ?= torch==$(TORCH_VERSION)+cpu --extra-index-url https://download.pytorch.org/whl/cpu
TORCH_WHY := no NVIDIA GPU: the CPU build, about 200 MB
else
TORCH ?= torch==$(TORCH_VERSION)
TORCH_WHY := not Linux: PyPI's build for this system
endif

BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: train test test-unit test-emulated-bf16 lint bench dryrun clean-venv

# torch alone from the index TORCH names; its dependencies come from PyPI with the rest,
# through uv, so that an index holding only torch's builds is asked for nothing else.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@echo "== installing $(TORCH) into $(VENV) ($(if $(filter command line environment,$(origin TORCH)),as TORCH says,$(TORCH_WHY)))"
	$(BIN)/python -m pip install --no-deps $(TORCH)
	@echo "== installing the project and its dependencies (pyproject.toml) with uv (~10x pip's speed)"
	$(BIN)/python -m pip install "uv>=0.9,<1"
	$(BIN)/uv pip install --python $(BIN)/python ".[dev]"
	touch $(STAMP)

train: $(STAMP)
	$(BIN)/python train.py $(if $(RUN),hydra.run.dir=$(RUN)) $(ARGS)

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
