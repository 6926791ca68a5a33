"""What PETSc 3.18 does to a step-by-step adjoint, and how the TS adapter meets each (one line where refused).

Version-dependent refusals are decided from ``PETSc.Sys.getVersion()`` at run time; each test asserts
the behaviour of the PETSc it runs on.
"""

import numpy as np
import pytest

from hpcadj.adjoint.verify import compute_gradient
from hpcadj.models.base import SolverError
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSRefused, TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import GrayScott, VanDerPol

HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_SELF


def _version():
    return tuple(petsc().Sys.getVersion())[:3]


def _array(vec):
    return vec.getArray(readonly=True).copy()


def _one_line(exc):
    text = str(exc.value)
    assert "\n" not in text and text
    return text


def test_a_ts_without_save_trajectory_gets_one(comm):
    """adjointStep on a TS that never had setSaveTrajectory segfaults: the adapter sets it, and the
    gradient is TSAdjointSolve's (the trajectory is never filled by step())."""
    ode = VanDerPol(comm, implicit=True)
    stepper = ode.stepper(20)
    mine = compute_gradient(stepper, stepper.default_controls())
    ref = VanDerPol(comm, implicit=True)
    theirs = tsadjoint_gradient(ref.ts, ref.u0, 20, HALF_NORM2, parameters=ref.p)
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))


def test_second_ts_on_the_same_dm_is_refused(comm):
    gs = GrayScott(comm, m=8)
    gs.stepper(3)
    other = petsc().TS().create(comm=comm)
    other.setDM(gs.da)
    other.setType("rk")
    other.setRHSFunction(gs._rhs, gs.u0.duplicate())
    other.setTimeStep(0.5)
    with pytest.raises(TSRefused) as exc:
        TSStepper(other, gs.u0, 3, final=HALF_NORM2)
    assert "DM" in _one_line(exc)


def test_ts_after_adjointsolve(comm):
    """After TSSolve + TSAdjointSolve the TS keeps a negative dt and its solution Vec is no longer u_n:
    refused in one line; once dt is set again, the gradient is a fresh TS's, bitwise."""
    used = VanDerPol(comm, implicit=True)
    theirs = tsadjoint_gradient(used.ts, used.u0, 20, HALF_NORM2, parameters=used.p)
    assert used.ts.getTimeStep() < 0
    with pytest.raises(TSRefused) as exc:
        used.stepper(20)
    assert "negative" in _one_line(exc) or "positive" in _one_line(exc)
    used.ts.setTime(0.0)
    used.ts.setTimeStep(0.001)
    mine = compute_gradient(*((s := used.stepper(20)), s.default_controls()))
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    assert np.array_equal(_array(mine.gradient["mu"]), _array(theirs.mu))


def test_arkimex_before_its_adjoint_existed(comm):
    ode = VanDerPol(comm, implicit=True)
    ode.ts.setType("arkimex")
    if _version() < (3, 19, 0):
        with pytest.raises(TSRefused) as exc:
            ode.stepper(5)
        text = _one_line(exc)
        assert "arkimex" in text and "3.19" in text and ".".join(map(str, _version())) in text
    else:
        assert ode.stepper(5).ts_type == "arkimex"


def test_rk_tableau_with_a_zero_weight(comm):
    """Dormand–Prince: PETSc < 3.21.4 gets the parameter gradient wrong (refused, one line); λ_0 alone is
    fine and bitwise TSAdjointSolve's."""
    ode = VanDerPol(comm, implicit=False)
    ode.ts.setRKType("5dp")
    if _version() < (3, 21, 4):
        with pytest.raises(TSRefused) as exc:
            ode.stepper(10)
        assert "5dp" in _one_line(exc) and "3.21.4" in _one_line(exc)
    else:
        ode.stepper(10)
    stepper = TSStepper(ode.ts, ode.u0, 10, final=HALF_NORM2)
    mine = compute_gradient(stepper, stepper.default_controls())
    ref = VanDerPol(comm, implicit=False)
    ref.ts.setRKType("5dp")
    theirs = tsadjoint_gradient(ref.ts, ref.u0, 10, HALF_NORM2)
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))


def test_events_and_quadrature_are_refused(comm):
    ode = VanDerPol(comm, implicit=True)
    ode.ts.setEventHandler([1], [False], lambda ts, t, u, f: None, None)
    with pytest.raises(TSRefused) as exc:
        ode.stepper(5)
    assert "events" in _one_line(exc)
    ode = VanDerPol(comm, implicit=True)
    ode.ts.createQuadratureTS()
    with pytest.raises(TSRefused) as exc:
        ode.stepper(5)
    assert "quadrature" in _one_line(exc)


def test_solver_failure_is_a_solver_error(comm):
    ode = VanDerPol(comm, mu=1e3, implicit=True)
    ode.ts.setTimeStep(0.5)
    ode.ts.getSNES().setTolerances(rtol=1e-14, atol=1e-14, max_it=1)
    stepper = ode.stepper(3)
    with pytest.raises(SolverError) as exc:
        compute_gradient(stepper, stepper.default_controls())
    assert "step 0" in str(exc.value) and "diverged" in str(exc.value)


def test_objective_is_required(comm):
    ode = VanDerPol(comm, implicit=True)
    with pytest.raises(TSRefused):
        TSStepper(ode.ts, ode.u0, 5)


def test_no_trajectory_directory_left_behind(comm, tmp_path, monkeypatch):
    """PETSc's default trajectory ('basic') makes a TS-data-XXXXXX directory in the working directory at
    set-up; neither the adapter nor the TSAdjointSolve check leaves one, even for a TS that had one."""
    monkeypatch.chdir(tmp_path)
    for implicit in (False, True):
        ode = VanDerPol(comm, implicit=implicit)
        stepper = ode.stepper(10)
        mine = compute_gradient(stepper, stepper.default_controls())
        ref = VanDerPol(comm, implicit=implicit)
        theirs = tsadjoint_gradient(ref.ts, ref.u0, 10, HALF_NORM2, parameters=ref.p)
        assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    used = VanDerPol(comm, implicit=True)
    used.ts.setSaveTrajectory()
    used.ts.setSolution(used.u0.copy())
    used.ts.step()                                     # a basic trajectory, its directory made
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("TS-data-")]
    used.stepper(10)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
