#!/usr/bin/env bash
# ruff over the tree, then the whole suite in one pytest session: serial tests run here, and
# tests/test_mpi_suites.py runs every tests/mpi/ module under real `mpirun -n 1, 2, 3` with a timeout
# each. The last line printed is pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# the linter first (pyproject.toml's [tool.ruff]; `make lint` alone): a finding fails the run
.venv/bin/ruff check . || { echo "run-tests: ruff found the problems above; no test was run" >&2; exit 1; }
# numba's kernel cache filled once, serially, before ranks of the MPI suites could race to write it
.venv/bin/python scripts/warm_kernels.py || echo "run-tests: kernel warm-up failed (the tests will say why)" >&2
# --durations=25: the 25 slowest tests at the end of every run (and CI log), so where the time goes is seen
exec .venv/bin/python -m pytest -ra -q --durations=25 -n "${HPCADJ_TEST_WORKERS:-2}" --dist loadgroup "$@"
