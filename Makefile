# The two commands a new user needs: `make demo` and `make test`. Both run the idempotent set-up.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
HPCADJ := $(VENV)/bin/hpcadj
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export OMPI_MCA_rmaps_base_oversubscribe := 1
MPIRUN := mpirun --oversubscribe
DEMO_RANKS ?= 2

.PHONY: setup demo test test-fast clean

setup:
	@bash scripts/setup.sh

demo: setup
	$(MPIRUN) -n $(DEMO_RANKS) $(HPCADJ) run --model heat --grid 128x128 --steps 100 --dt 1e-4 --theta 0.5

test: setup
	@bash scripts/run-tests.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
