# One venv, CPU torch first (a plain `torch` requirement would pull a multi-GB CUDA build).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export PREFECT_SERVER_ANALYTICS_ENABLED := false
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DS_ACCELERATOR ?= cpu
export TOKENIZERS_PARALLELISM := false
# The venv's packages are installed without bytecode (below), so every process compiles what
# it imports; with PYTHONDONTWRITEBYTECODE set (Docker-style shells, this project's dev
# machines) none is ever written and each process recompiles torch, transformers, prefect and
# mlflow: ~30 s to import them, ~11 s once their bytecode is on disk. The first run writes it.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo demo-tiny test test-all lint typecheck check bench clean steward-env lock

# Every version comes from requirements/lock.txt (scripts/lock.sh; a constraints file: EXTRAS
# picks what is installed, the lock fixes which version), so a new upstream release never
# changes what CI installs. uv installs it in seconds, where pip takes ~90 s; torch is the CPU
# build on local disk (TORCH_WHEELS, pip's find-links here). Where uv fails, pip does it. No bytecode
# compilation at install: compiling every installed package took ~49 s of a ~55 s install,
# while a run compiles only the modules it imports, once. EXTRAS: CI adds `ray`.
TORCH_WHEELS ?= /opt/wheels
EXTRAS ?= cpu,dev

LOCK := requirements/lock.txt
UV_VERSION := 0.13.9
$(BIN)/.installed: pyproject.toml $(LOCK)
	$(PY) -m venv $(VENV)
	-$(BIN)/pip install -q 'uv==$(UV_VERSION)'
	$(BIN)/uv pip install -q --python $(BIN)/python --find-links $(TORCH_WHEELS) \
	    -c $(LOCK) 'torch==2.13.0+cpu' -e '.[$(EXTRAS)]' \
	  || { $(BIN)/pip install -q -c $(LOCK) torch==2.13.0 \
	       && $(BIN)/pip install -q -c $(LOCK) -e '.[$(EXTRAS)]'; }
	touch $@

install: $(BIN)/.installed

# Label Studio for stewards (tests/flows/test_steward_label_studio.py, README "Stewards"), in
# its own venv: its pins (pyarrow<25, Django) conflict with ours. The pipeline talks to it over
# HTTP (searchrl/eval/label_studio_api.py), so nothing of it enters .venv.
STEWARD_VENV ?= .venv-steward
# Installed from its lock (requirements/steward-lock.txt): an unlocked install took sentry-sdk
# 3.0.0 the day it was released and label-studio 1.23.2 died at import.
STEWARD_LOCK := requirements/steward-lock.txt
steward-env: $(STEWARD_VENV)/.installed
$(STEWARD_VENV)/.installed: $(STEWARD_LOCK) | install
	$(PY) -m venv $(STEWARD_VENV)
	$(BIN)/uv pip install -q --python $(STEWARD_VENV)/bin/python -r $(STEWARD_LOCK) \
	  || $(STEWARD_VENV)/bin/pip install -q -r $(STEWARD_LOCK)
	touch $@

# Exit 1 is the gate's NO-GO: a finished run with a decision, not a failed demo.
# The embedded default: the MiniLM prior (configs/prior.yaml), the policy that learns from RL
# here (docs/results/prior.md); about 17 minutes on 2 cores, most of it the cold start.
demo: install  ## the whole pipeline on the embedded default (MiniLM prior, bundled data, CPU)
	$(BIN)/python flows/pipeline.py --config configs/prior.yaml; rc=$$?; \
	  if [ $$rc -eq 1 ]; then echo "demo finished: the gate decided NO-GO (exit 1), see the report"; \
	  else exit $$rc; fi

# The pipeline's mechanics in 5 minutes: the tiny model trained from scratch (configs/tiny.yaml),
# which reads nothing on this world, so its training changes nothing (the report says so).
demo-tiny: install  ## the whole pipeline in 5 minutes with the tiny from-scratch model
	$(BIN)/python flows/pipeline.py --config configs/tiny.yaml; rc=$$?; \
	  if [ $$rc -eq 1 ]; then echo "demo finished: the gate decided NO-GO (exit 1), see the report"; \
	  else exit $$rc; fi

# Two workers (pytest-xdist), a test file to a worker: module fixtures (a trained tiny policy,
# an index) are built once per file, as in a serial run. PYTEST_WORKERS=0 runs serially.
PYTEST_WORKERS ?= 2
test: install  ## the default test run (slow tests excluded)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

test-all: install
	$(BIN)/python -m pytest -q -m ''

lint: install
	$(BIN)/ruff check .

typecheck: install
	$(BIN)/mypy

check: lint typecheck test

lock: install  ## re-resolve requirements/*lock.txt (scripts/lock.sh; LOCK_DATE moves the index's date)
	UV=$(BIN)/uv scripts/lock.sh

clean:
	rm -rf runs mlflow.db mlartifacts .pytest_cache .mypy_cache .ruff_cache
