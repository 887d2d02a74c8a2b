# Two entry points for a fresh machine: `make run` (main job) and `make test` (whole suite).
# Each creates its own virtual environment in .venv from pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

# The storage tests run against this PostgreSQL (trust auth); override to use another.
export REPACK_TEST_POSTGRES_URL ?= postgresql+psycopg://postgres@127.0.0.1:5432/test

.PHONY: run test lint typecheck pytest venv services clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[api,runtime,dev]'
	touch $(STAMP)

venv: $(STAMP)

# The main job: the paper-style tables of the 64-GPU scenarios (60% fill, then packed by a
# loader to >= 99% of every rank's memory), then the service on the embedded
# SQLite default with 20 of its steps posted and the dashboard URL printed (Ctrl-C stops it).
run: $(STAMP)
	$(BIN)/repack replay scenarios/gpu64-200steps.yaml
	$(BIN)/repack replay scenarios/gpu64-packed.yaml
	$(BIN)/repack demo --trace scenarios/gpu64-200steps.yaml --steps 20

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

services:
	bash scripts/ensure-test-services.sh

pytest: $(STAMP) services
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

clean:
	rm -rf $(VENV)
