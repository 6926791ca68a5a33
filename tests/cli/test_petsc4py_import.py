"""A user's petsc4py script runs unchanged after ``make setup``: ``import petsc4py;
petsc4py.init(sys.argv)`` in the project's venv and in Debian's own python3, with no PETSC_DIR set
(Debian's petsc4py.pth looks in /usr/lib/petsc, which scripts/setup.sh registers)."""

import json
import os
import subprocess

import pytest

from ..helpers import HPCADJ, PYTHON

SCRIPT = """\
import sys
import petsc4py
petsc4py.init(sys.argv)
from petsc4py import PETSc
x = PETSc.Vec().createSeq(3)
x.set(2.0)
print(PETSc.Sys.getVersion(), x.sum(), PETSc.Options().getInt("n", 0))
"""


@pytest.mark.parametrize("python", [PYTHON, "/usr/bin/python3"], ids=["venv", "debian"])
def test_a_users_petsc4py_script_runs_unchanged(tmp_path, python):
    script = tmp_path / "user.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in ("PETSC_DIR", "PETSC_ARCH", "PYTHONPATH")}
    proc = subprocess.run([python, str(script), "-n", "7"], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("6.0 7"), proc.stdout


USER_MODEL = """\
import sys

import numpy as np
import petsc4py
petsc4py.init(sys.argv)
from petsc4py import PETSc


def build(comm, args=None):
    from hpcadj.ts import TSStepper

    u0 = PETSc.Vec().createMPI((4 if comm.rank == 0 else 0, 4), comm=comm)
    u0.getArray()[:] = np.arange(1.0, 1.0 + u0.getLocalSize())
    J = PETSc.Mat().createDense([(u0.getLocalSize(), 4), (u0.getLocalSize(), 4)], comm=comm)
    J.setUp()

    def rhs(ts, t, u, f):
        u.copy(f)
        f.scale(-0.5)

    def jacobian(ts, t, u, A, B):
        A.zeroEntries()
        A.shift(-0.5)
        return True

    ts = PETSc.TS().create(comm=comm)
    ts.setType("cn")
    ts.setRHSFunction(rhs, u0.duplicate())
    ts.setRHSJacobian(jacobian, J)
    ts.setTimeStep(0.1)
    ts.setMaxSteps(4)
    ts.setFromOptions()
    return TSStepper(ts, u0, 4, final=(lambda u: u.dot(u) / 2, lambda u: u.copy()), name="plain_petsc4py")
"""


def test_a_model_file_importing_petsc4py_itself_runs_under_hpcadj(tmp_path):
    """The user's TS module as they wrote it, petsc4py.init(sys.argv) at its top, under ``hpcadj run``:
    J = 1/2 |exp(-0.2) u_0|^2 to CN's accuracy, and the PETSc option on the command line applies."""
    (tmp_path / "user_model.py").write_text(USER_MODEL)
    env = {k: v for k, v in os.environ.items() if k not in ("PETSC_DIR", "PETSC_ARCH")}
    proc = subprocess.run([HPCADJ, "run", "--model", "user_model.py:build",
                           "--json", "-ts_type", "beuler"], cwd=tmp_path, env=env, text=True,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    beuler = 0.5 * 30.0 / (1.0 + 0.05) ** 8                  # |u_0|^2 = 30, four steps of 1/(1 + 0.05)
    assert info["J"] == pytest.approx(beuler, rel=1e-12), info["J"]
