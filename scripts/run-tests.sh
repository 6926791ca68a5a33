#!/usr/bin/env bash
# The whole suite in one pytest session: serial tests run here, and tests/test_mpi_suites.py runs
# every tests/mpi/ module under real `mpirun -n 1, 2, 3` with a timeout each. The last line printed
# is pytest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."
# numba's kernel cache filled once, serially, before ranks of the MPI suites could race to write it
.venv/bin/python scripts/warm_kernels.py || echo "run-tests: kernel warm-up failed (the tests will say why)" >&2
exec .venv/bin/python -m pytest -ra -q "$@"
