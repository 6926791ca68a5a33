#!/usr/bin/env bash
# ruff over the tree, then the whole suite in one pytest session on two pytest-xdist workers
# (docs/testing.md): the serial tests, and tests/test_mpi_suites.py's runs of every tests/mpi/ module
# under real `mpirun -n 1, 2, 3` with a timeout each. The last line printed is pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# the linter first (pyproject.toml's [tool.ruff]; `make lint` alone): a finding fails the run
.venv/bin/ruff check . || { echo "run-tests: ruff found the problems above; no test was run" >&2; exit 1; }
# numba's kernel cache filled once, before ranks of the MPI suites could race to write it,
# in two processes side by side, each a share of the models (a fresh clone's warm-up is 25-40 s)
.venv/bin/python scripts/warm_kernels.py 0 2 & first=$!
.venv/bin/python scripts/warm_kernels.py 1 2 & second=$!
{ wait "$first" && wait "$second"; } || echo "run-tests: kernel warm-up failed (the tests will say why)" >&2
# --durations=25: the 25 slowest tests at the end of every run (and CI log), so where the time goes is seen
exec .venv/bin/python -m pytest -ra -q --durations=25 -n "${HPCADJ_TEST_WORKERS:-2}" --dist loadgroup "$@"
