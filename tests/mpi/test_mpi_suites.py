"""Run every tests/mpi/ranks/ module under real ``mpirun -n 1, 2, 3 --oversubscribe``.

Each rank runs pytest on the modules of one run; a failure on any rank makes mpirun exit non-zero
and fails the test here; a deadlock is killed at the timeout and fails too. Every rank pays Python,
MPI, PETSc, numba and pytest start-up (about 1.3 s of CPU on 2 cores), so the modules share two
runs per rank count, of about equal cost: second-order and inversion modules, and the rest. A
module in no group runs alone. The test's id names every module of its run, so ``-k test_X``
still selects the run that holds test_X.
"""

import pytest

from ..helpers import PYTHON, ROOT, mpirun

MODULES = sorted(p.name for p in (ROOT / "tests" / "mpi" / "ranks").glob("test_*.py"))
#: modules run together by one mpirun per rank count
GROUPS = [
    ("test_hessian.py", "test_hessian_data.py", "test_hessian_newton.py", "test_hessian_plans.py", "test_hessian_products.py",
     "test_inversion.py", "test_inversion_reuse.py", "test_inversion_shots.py"),
    ("test_adaptive.py", "test_adaptive_evaluations.py", "test_burgers.py", "test_burgers_tiled.py", "test_calibrate.py", "test_checkpointing.py", "test_collective.py",
     "test_contract.py", "test_faults.py", "test_grayscott.py", "test_heat.py", "test_kernels.py",
     "test_layout_corrupt.py", "test_memory_compression.py", "test_online_driver.py", "test_refused_levels.py", "test_run_guards.py",
     "test_rundir_identity.py", "test_storage_attach.py", "test_storage_levels.py", "test_telemetry_runlog.py",
     "test_ts_grayscott.py", "test_ts_stages.py", "test_ts_trust.py", "test_wave.py", "test_wave_tiled.py", "test_mixed.py",
     "test_mixed_choice.py"),
]
GROUPED = {name for group in GROUPS for name in group}
RUNS = [tuple(name for name in group if name in MODULES) for group in GROUPS] + [
    (name,) for name in MODULES if name not in GROUPED]
TIMEOUT_S = 600


def test_every_grouped_module_exists():
    """A module renamed or removed must leave the groups too (else the group runs less than it says)."""
    assert GROUPED <= set(MODULES), sorted(GROUPED - set(MODULES))


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("nranks", [1, 2, 3])
@pytest.mark.parametrize("modules", [run for run in RUNS if run], ids="+".join)
def test_under_mpirun(modules, nranks, tmp_path):
    proc = mpirun(nranks, [PYTHON, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           *(f"tests/mpi/ranks/{name}" for name in modules)],
                  timeout=TIMEOUT_S, env={"HPCADJ_MPI_WORKER": "1", "HPCADJ_MPI_BASETEMP": str(tmp_path)})
    assert proc.returncode == 0, (
        f"mpirun -n {nranks} {' '.join(modules)}: rc={proc.returncode}\n{proc.stdout[-8000:]}\n{proc.stderr[-4000:]}")
