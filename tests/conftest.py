"""Serial pytest session: tests/mpi/ is collected only inside mpirun (see test_mpi_suites.py)."""

import os

if not os.environ.get("HPCADJ_MPI_WORKER"):
    collect_ignore = ["mpi"]
