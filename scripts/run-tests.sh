#!/usr/bin/env bash
# ruff over the tree, then the whole suite in one pytest session on two pytest-xdist workers
# (docs/testing.md): the serial tests, and tests/mpi/test_mpi_suites.py's runs of every tests/mpi/ranks/ module
# under real `mpirun -n 1, 2, 3` with a timeout each. The last line printed is pytest's summary.
# `make test` runs scripts/setup.sh first, which also compiles the kernels into numba's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
# the linter first (pyproject.toml's [tool.ruff]; `make lint` alone): a finding fails the run
.venv/bin/ruff check . || { echo "run-tests: ruff found the problems above; no test was run" >&2; exit 1; }
# --durations=25: the 25 slowest tests at the end of every run (and CI log), so where the time goes is seen
exec .venv/bin/python -m pytest -ra -q --durations=25 -n "${HPCADJ_TEST_WORKERS:-2}" --dist loadgroup "$@"
