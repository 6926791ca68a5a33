"""A user's petsc4py script runs unchanged after ``make setup``: ``import petsc4py;
petsc4py.init(sys.argv)`` in the project's venv and in Debian's own python3, with no PETSC_DIR set
(Debian's petsc4py.pth looks in /usr/lib/petsc, which scripts/setup.sh registers)."""

import os
import subprocess

import pytest

from .helpers import PYTHON

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
