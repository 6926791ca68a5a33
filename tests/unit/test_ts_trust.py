"""A user's TS refused before its first step where it cannot work, never a silent wrong gradient.

In-process on one rank (COMM_SELF): the parameter written into the user's own Vec, the probe that
a changed parameter reaches the step, the arguments checked against the TS, the TS types PETSc
cannot step or adjoint-step. The command-line forms (exit 2, one line) are in test_ts_trust_cli.py.
"""

import numpy as np
import pytest

from hpcadj.adjoint.contract import check_contract
from hpcadj.adjoint.verify import compute_gradient
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSRefused, TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import VanDerPol

HALF_NORM2 = (lambda u: 0.5 * u.dot(u), lambda u: u.copy())


@pytest.fixture(scope="module")
def comm():
    petsc()
    return mpi().COMM_SELF


def _one_line(exc) -> str:
    text = str(exc.value)
    assert text and "\n" not in text, text
    return text


class Reaction:
    """u_t = D u_xx + k u (1 - u), periodic on n points, CN; k is the parameter (one entry).

    ``reads``: where the callbacks take k from: "vec" (the parameter Vec the stepper was given) or
    "float" (a number captured at construction, as in a script written for TSAdjointSolve)."""

    def __init__(self, comm, n=16, k=2.0, reads="vec", u0=None, dt=0.01, jp_sign=1.0):
        PETSc = petsc()
        self.n, self.h, self.D, self.reads, self.k = n, 1.0 / n, 1e-3, reads, k
        self.jp_sign = jp_sign                 # -1: a JacobianP of the wrong sign (a wrong adjoint)
        self.p = PETSc.Vec().createSeq(1, comm=comm)
        self.p.set(k)
        self.u0 = PETSc.Vec().createSeq(n, comm=comm)
        x = (np.arange(n) + 0.5) * self.h
        self.u0.getArray()[:] = 0.3 + 0.2 * np.sin(2 * np.pi * x) if u0 is None else u0
        J = PETSc.Mat().createDense([n, n], comm=comm)
        J.setUp()
        self.Jp = PETSc.Mat().createDense([n, 1], comm=comm)
        self.Jp.setUp()
        ts = PETSc.TS().create(comm=comm)
        ts.setType("cn")
        ts.setRHSFunction(self.rhs, self.u0.duplicate())
        ts.setRHSJacobian(self.jacobian, J)
        ts.setRHSJacobianP(self.jacobian_p, self.Jp)
        ts.setTimeStep(dt)
        ts.setMaxSteps(10)
        ts.getSNES().setTolerances(rtol=1e-14, atol=1e-14)
        self.ts = ts

    def kappa(self):
        return float(self.p.getArray(readonly=True)[0]) if self.reads == "vec" else self.k

    def rhs(self, ts, t, u, f):
        w = u.getArray(readonly=True)
        f.getArray()[:] = self.D * (np.roll(w, 1) - 2 * w + np.roll(w, -1)) / self.h ** 2 + self.kappa() * w * (1 - w)

    def jacobian(self, ts, t, u, A, B):
        w, n, c = u.getArray(readonly=True), self.n, self.D / self.h ** 2
        M = np.diag(-2 * c + self.kappa() * (1 - 2 * w))
        M[np.arange(n), (np.arange(n) + 1) % n] += c
        M[np.arange(n), (np.arange(n) - 1) % n] += c
        A.setValues(range(n), range(n), M.ravel())
        A.assemble()
        return True

    def jacobian_p(self, ts, t, u, C):
        w = u.getArray(readonly=True)
        C.setValues(range(self.n), [0], (self.jp_sign * w * (1 - w))[:, None])
        C.assemble()
        return True

    def stepper(self, steps=10, **kw):
        return TSStepper(self.ts, self.u0, steps, parameters={"k": self.p}, final=HALF_NORM2, **kw)


def _array(vec):
    return vec.getArray(readonly=True).copy()


# -- the parameter reaches the user's callbacks ------------------------------------------------------
def test_parameter_is_written_into_the_users_vec(comm):
    """No apply_parameters, callbacks reading the Vec they gave: at k doubled (not the first
    evaluation's control), J and the gradient are TSAdjointSolve's at k doubled, bitwise."""
    model = Reaction(comm)
    stepper = model.stepper()
    first = compute_gradient(stepper, stepper.default_controls())
    controls = stepper.default_controls()
    controls["k"].scale(2.0)
    mine = compute_gradient(stepper, controls)
    ref = Reaction(comm, k=4.0)
    theirs = tsadjoint_gradient(ref.ts, ref.u0, 10, HALF_NORM2, parameters=ref.p)
    assert mine.J == theirs.J and mine.J != first.J
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    assert np.array_equal(_array(mine.gradient["k"]), _array(theirs.mu))
    assert float(stepper.default_controls()["k"].getArray()[0]) == 2.0   # the default stays the given value


def test_parameter_the_callbacks_never_read_is_refused(comm):
    model = Reaction(comm, reads="float")
    with pytest.raises(TSRefused) as exc:
        model.stepper()
    text = _one_line(exc)
    assert "parameter 'k' does not reach the TS" in text and "apply_parameters" in text


def test_apply_parameters_that_drops_the_value_is_refused(comm):
    model = Reaction(comm, reads="float")
    with pytest.raises(TSRefused) as exc:
        model.stepper(apply_parameters=lambda vec: None)
    assert "apply_parameters(vec) does not pass the value on" in _one_line(exc)


def test_a_first_step_that_does_not_depend_on_the_parameter_is_not_refused(comm):
    """u0 = 0: k u (1 - u) and its JacobianP vanish, so the first step cannot show k; PETSc's adjoint
    step agrees (zero parameter gradient), and nothing is refused."""
    model = Reaction(comm, reads="float", u0=np.zeros(16))
    stepper = model.stepper()
    assert stepper.default_controls()["k"].getArray()[0] == 2.0


# -- the arguments, before the first step ---------------------------------------------------------
def test_parameter_vec_not_laid_out_as_the_rhs_jacobian_p(comm):
    model = Reaction(comm)
    model.p = petsc().Vec().createSeq(3, comm=comm)
    with pytest.raises(TSRefused) as exc:
        model.stepper()
    text = _one_line(exc)
    assert "parameters['k'] has 3 entries where 1 are expected (the RHSJacobianP's columns)" in text


def test_parameter_vec_not_laid_out_as_the_ijacobian_p(comm):
    """petsc4py 3.18 cannot read an IJacobianP: the matrix PETSc hands the callback in an adjoint step
    tried before the first step is compared with the Vec, and the refusal names the argument."""
    ode = VanDerPol(comm, implicit=True)
    wrong = petsc().Vec().createSeq(3, comm=comm)
    with pytest.raises(TSRefused) as exc:
        TSStepper(ode.ts, ode.u0, 5, parameters={"mu": wrong}, apply_parameters=ode.set_mu, final=HALF_NORM2)
    text = _one_line(exc)
    assert text.startswith("parameters['mu'] has 3 entries where 1 are expected (the IJacobianP's columns)"), text


def test_parameter_given_as_a_numpy_array(comm):
    model = Reaction(comm)
    model.p = np.array([2.0])
    with pytest.raises(TSRefused) as exc:
        model.stepper()
    assert "parameters['k'] is a numpy.ndarray, not a PETSc Vec" in _one_line(exc)


@pytest.mark.parametrize("final,expected", [
    ((lambda u: 0.5 * u.dot(u), lambda u: u.getArray().copy()),
     "final's gradient(u) returned a numpy.ndarray, not a PETSc Vec"),
    ((lambda u: 0.5 * u.dot(u), lambda u: petsc().Vec().createSeq(3, comm=u.getComm())),
     "final's gradient(u) returned a Vec of 3 entries"),
    ((lambda u: u.copy(), lambda u: u.copy()), "final's value(u) returned a PETSc Vec, not a number"),
    ((lambda u: "J", lambda u: u.copy()), "final's value(u) returned a str, not a number"),
])
def test_objective_of_the_wrong_kind(comm, final, expected):
    model = Reaction(comm)
    with pytest.raises(TSRefused) as exc:
        TSStepper(model.ts, model.u0, 5, parameters={"k": model.p}, final=final)
    assert expected in _one_line(exc)


def test_every_step_gradient_of_the_wrong_kind(comm):
    model = Reaction(comm)
    every = (lambda i, t, u: u.sum(), lambda i, t, u: np.ones(16))
    with pytest.raises(TSRefused) as exc:
        TSStepper(model.ts, model.u0, 5, parameters={"k": model.p}, every_step=every)
    assert "every_step's gradient(i, t, u) returned a numpy.ndarray" in _one_line(exc)


def test_initial_state_not_laid_out_as_the_jacobian(comm):
    model = Reaction(comm)
    wrong = petsc().Vec().createSeq(12, comm=comm)
    with pytest.raises(TSRefused) as exc:
        TSStepper(model.ts, wrong, 5, parameters={"k": model.p}, final=HALF_NORM2)
    assert "u0 has 12 entries where 16 are expected (the TS's Jacobian's rows)" in _one_line(exc)


def _from_options(ts, prefix, **options):
    """``ts.setFromOptions()`` with ``options`` given under ``prefix``, as on a command line."""
    opts = petsc().Options()
    for key, value in options.items():
        opts[prefix + key] = value
    try:
        ts.setOptionsPrefix(prefix)
        ts.setFromOptions()
    finally:
        for key in options:
            opts.delValue(prefix + key)


# -- what PETSc can step and adjoint-step ------------------------------------------------------------
@pytest.mark.parametrize("ts_type,implicit,missing", [
    ("euler", False, "adjointstep"), ("ssp", False, "adjointstep"), ("alpha", True, "adjointstep"),
    ("glle", True, "step"), ("bdf", True, "adjointstep"), ("rosw", True, "adjointstep")])
def test_ts_types_petsc_cannot_step_or_adjoint_step(comm, ts_type, implicit, missing):
    """Asked of PETSc on the user's TS before the first step: its TSStep and TSAdjointStep (the type
    given as -ts_type is: GLLE set up without TSSetFromOptions has no scheme and crashes PETSc)."""
    ode = VanDerPol(comm, implicit=implicit)
    _from_options(ode.ts, f"trust_{ts_type}_", ts_type=ts_type)
    with pytest.raises(TSRefused) as exc:
        ode.stepper(5)
    text = _one_line(exc)
    assert f"TS type {ts_type}" in text and f"No method {missing} " in text and "-ts_type rk" in text


def test_adaptive_ts_without_an_end_time(comm):
    ode = VanDerPol(comm, implicit=False)
    ode.ts.setRKType("2a")                                # embedded error estimate, no zero weight
    ode.ts.setMaxTime(float(np.finfo(float).max))
    _from_options(ode.ts, "trust_adapt_", ts_adapt_type="basic")
    with pytest.raises(TSRefused) as exc:
        ode.stepper()
    assert "needs an end time: give -ts_max_time T" in _one_line(exc)


# -- hpcadj check on a TS: what applies ----------------------------------------------------------------
def test_check_reports_what_applies_to_a_ts(comm):
    report = check_contract(Reaction(comm).stepper(), steps=2)
    status = {p.name: p.status for p in report.properties}
    assert status["adjoint_transpose"] == "NOT CHECKED" and "no tangent step" in report["adjoint_transpose"].reason
    for name in ("step_pure", "inputs_untouched", "snapshot_round_trip", "adjoint_difference", "parameters_used"):
        assert status[name] == "PASSED", (name, report[name].reason)
    assert status["adjoint_data"] == "NOT CHECKED"      # CN: its stages are the states
    assert report.passed


def test_check_verifies_an_rk_ts_stages(comm):
    """RK4: the stages declared as adjoint data reverse a step bitwise as a recomputed step does."""
    model = Reaction(comm)
    model.ts.setType("rk")
    model.ts.setRKType("4")
    report = check_contract(model.stepper(), steps=2)
    assert report["adjoint_data"].status == "PASSED", report["adjoint_data"].reason
    assert report.passed


def test_check_finds_a_wrong_parameter_adjoint(comm):
    """A JacobianP of the wrong sign: the adjoint disagrees with central differences of the step."""
    report = check_contract(Reaction(comm, jp_sign=-1.0).stepper(), steps=2)
    assert report["adjoint_difference"].status == "FAILED" and "control 'k'" in report["adjoint_difference"].reason
    assert not report.passed


def test_check_finds_a_parameter_the_step_stops_reading(comm):
    model = Reaction(comm)
    stepper = model.stepper()
    model.reads = "float"                    # from here on the callbacks ignore the value hpcadj sets
    report = check_contract(stepper, steps=2)
    assert report["parameters_used"].status == "FAILED" and "'k'" in report["parameters_used"].reason
