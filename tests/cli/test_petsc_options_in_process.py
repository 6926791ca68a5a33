"""PETSc options of an in-process ``hpcadj.cli.main`` call once PETSc is initialised.

The first command of a process initialises PETSc with its options; a later one (tests, a notebook,
a script that initialised petsc4py first) finds PETSc running. Its options must still reach PETSc,
and be gone after it, so the call after that does not inherit them.
"""

from hpcadj.imports import petsc

from ..helpers import PYTHON, hpcadj_in_process, run

RUN = ["run", "--grid", "6x6", "--steps", "1", "--quiet"]

#: two commands in a fresh process: the first starts PETSc with its options
FRESH = f"""
import sys
from hpcadj.cli import main

assert main({RUN!r} + ["-heat_ksp_type", "gmres", "-heat_ksp_view"]) == 0
print("=== second", flush=True)
assert main({RUN!r}) == 0
"""


def test_options_reach_an_initialised_petsc_and_leave_with_the_command():
    PETSc = petsc()  # as a script that initialised PETSc itself
    assert PETSc.Sys.isInitialized()
    first = hpcadj_in_process([*RUN, "-heat_ksp_type", "gmres", "-heat_ksp_view"])
    assert first.returncode == 0, first.stderr
    assert "KSP Object: (heat_)" in first.stdout and "type: gmres" in first.stdout, first.stdout[-2000:]
    assert not PETSc.Options().hasName("heat_ksp_view")

    second = hpcadj_in_process(RUN)
    assert second.returncode == 0, second.stderr
    assert "KSP Object" not in second.stdout, second.stdout[-2000:]


def test_an_option_set_before_the_command_is_restored_after_it():
    opts = petsc().Options()
    opts.setValue("heat_ksp_view", None)
    opts.setValue("heat_ksp_type", "cg")
    try:
        proc = hpcadj_in_process([*RUN, "-heat_ksp_type", "gmres"])
        assert proc.returncode == 0, proc.stderr
        assert "type: gmres" in proc.stdout, proc.stdout[-2000:]
        assert opts.getString("heat_ksp_type") == "cg" and opts.hasName("heat_ksp_view")
    finally:
        opts.delValue("heat_ksp_type")
        opts.delValue("heat_ksp_view")


def test_options_of_the_command_that_starts_petsc_leave_with_it():
    proc = run([PYTHON, "-c", FRESH], timeout=300)
    assert proc.returncode == 0 and "=== second" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    first, second = proc.stdout.split("=== second")
    assert "type: gmres" in first, first[-2000:]
    assert "KSP Object" not in second, second[-2000:]
