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

.PHONY: setup demo test test-fast lint test-cluster clean

setup:
	@bash scripts/setup.sh

DEMO_DIR := out/demo

# A three-level gradient (RAM + node-local disk + parallel HDF5) on 2 ranks, logged and analysed.
# Gray-Scott's Newton solves make a step dear enough that the planner uses all three levels.
demo: setup
	@rm -rf $(DEMO_DIR) && mkdir -p $(DEMO_DIR)/local
	$(MPIRUN) -n $(DEMO_RANKS) $(HPCADJ) run --model grayscott --grid 48x48 --steps 40 \
	    --ram 2 --disk 2 --pfs 6 --local-dir $(DEMO_DIR)/local --pfs-file $(DEMO_DIR)/checkpoints.h5 \
	    --log-dir $(DEMO_DIR)/logs --gradient-out $(DEMO_DIR)/gradient.h5
	$(HPCADJ) analyze $(DEMO_DIR)/logs --markdown

test: setup
	@bash scripts/run-tests.sh

# The unit tier only (tests/unit/): pure Python, no mpirun, no subprocess, on two workers; ~1 minute.
test-fast: setup
	@$(PY) -m pytest -q -n 2 tests/unit

# ruff over the tree, with the rules in pyproject.toml ([tool.ruff]); `make test` runs it first.
lint: setup
	@$(VENV)/bin/ruff check .

# jobs/*.sbatch on a private 3-node SLURM on this machine: the tests/cluster/ files that wait for
# HPCADJ_TEST_CLUSTER (test_slurm_jobs.py and test_slurm_cluster_script.py run in `make test`); a few minutes.
test-cluster: setup
	@HPCADJ_TEST_CLUSTER=1 $(PY) -m pytest -ra -q tests/cluster \
	    --ignore=tests/cluster/test_slurm_jobs.py --ignore=tests/cluster/test_slurm_cluster_script.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Reproducible studies (experiments/): `make experiments`, or one with `make experiment-<name>`.
include mk/experiments.mk
