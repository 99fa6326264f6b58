# The two commands of the README: `make demo` and `make test`. Both build .venv first when missing.
SHELL := /bin/bash
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint typecheck golden bench env clean gpu-check

$(STAMP): pyproject.toml constraints.txt scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

env: $(STAMP)

demo: $(STAMP)
	bash scripts/demo.sh

# Two workers (the machine's two cores: most of a multi-process test's time is start-up and waiting
# on its peers), each taking a whole test file, so that a module's fixtures (the catalog's grouped
# launches, the Slurm cluster) are built by one worker only. More workers want more cores and about
# 5 GB of memory each (TEST_WORKERS=4 make test).
TEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

# The edit loop: everything but the multi-process CPU runs and the Slurm jobs (the engine still
# trains in-process, tests/unit/training/test_engine.py). GPU tests skip without a GPU here as in `make test`.
test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "not smoke and not slurm"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	$(MAKE) --no-print-directory typecheck

# mypy over the six packages (pyproject.toml [tool.mypy]); CI runs it before the tests.
typecheck: $(STAMP)
	$(VENV)/bin/mypy

golden: $(STAMP)
	$(VENV)/bin/python -m tests.support.refresh_golden

bench: $(STAMP)
	$(VENV)/bin/python bench/cli_latency.py

# The GPU tests and benchmarks on a bare lent GPU: no .venv there, the machine's python3 and torch plus the wheels of
# scripts/fetch_gpu_wheels.py (carried as wheels/gpu); figures under $$OUT. scripts/gpu_check.sh.
gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV)
