"""Run every tests/mpi/ module under real ``mpirun -n 1, 2, 3 --oversubscribe``.

Each rank runs pytest on the module; a failure on any rank makes mpirun exit non-zero and fails the
test here; a deadlock is killed at the timeout and fails too.
"""

import pytest

from .helpers import PYTHON, ROOT, mpirun

MODULES = sorted(p.name for p in (ROOT / "tests" / "mpi").glob("test_*.py"))
TIMEOUT_S = 420


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("module", MODULES)
def test_under_mpirun(module, nranks, tmp_path):
    proc = mpirun(nranks, [PYTHON, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           f"tests/mpi/{module}"],
                  timeout=TIMEOUT_S, env={"HPCADJ_MPI_WORKER": "1", "HPCADJ_MPI_BASETEMP": str(tmp_path)})
    assert proc.returncode == 0, (
        f"mpirun -n {nranks} {module}: rc={proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}")
