"""A user's TS on every rank: the parameter written into the user's own Vec gives TSAdjointSolve's
gradient at a new control, and the refusals before the first step are one agreed line on every rank.

The TS is a 1-D periodic reaction–diffusion on a DMDA (as in docs/ts.md), the parameter k a scalar
Vec owned by rank 0; its callbacks read k from that Vec (``reads="vec"``) or from a number captured
when the TS was built (``reads="float"``).
"""

import numpy as np
import pytest

from hpcadj.adjoint.contract import check_contract
from hpcadj.adjoint.verify import compute_gradient
from hpcadj.imports import petsc
from hpcadj.ts import TSRefused, TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import VanDerPol

N_POINTS, STEPS = 24, 6


def _objective(n):
    return (lambda u: u.dot(u) / (2 * n), lambda u: u * (1.0 / n))


def _reaction(comm, k=2.0, reads="vec", p_on_last=False):
    """(ts, u0, k_vec): u_t = D u_xx + k u (1 - u) with CN and an AIJ Jacobian."""
    PETSc = petsc()
    n = N_POINTS
    da = PETSc.DMDA().create(dim=1, sizes=(n,), dof=1, boundary_type="periodic", stencil_width=1, comm=comm)
    h, D, captured = 1.0 / n, 1e-3, k
    local, (xs, xe) = da.createLocalVec(), da.getRanges()[0]
    lo = xs - da.getGhostRanges()[0][0]
    owner = comm.size - 1 if p_on_last else 0
    k_vec = PETSc.Vec().createMPI((1 if comm.rank == owner else 0, 1), comm=comm)
    k_vec.set(k)

    def kappa():
        if reads == "float":
            return captured
        return comm.bcast(float(k_vec.getArray(readonly=True)[0]) if comm.rank == owner else None, root=owner)

    def rhs(ts, t, u, f):
        da.globalToLocal(u, local)
        g = local.getArray(readonly=True)
        w = g[lo:lo + xe - xs]
        f.getArray()[:] = D * (g[lo - 1:lo - 1 + xe - xs] - 2 * w + g[lo + 1:lo + 1 + xe - xs]) / h**2 + kappa() * w * (1 - w)

    rows = np.arange(xs, xe, dtype=PETSc.IntType)
    cols = np.stack([(rows - 1) % n, rows, (rows + 1) % n], axis=1).ravel().astype(PETSc.IntType)
    ptr = np.arange(0, 3 * len(rows) + 1, 3, dtype=PETSc.IntType)

    def jacobian(ts, t, u, A, B):
        w = u.getArray(readonly=True)
        vals = np.empty((len(w), 3))
        vals[:, 0] = vals[:, 2] = D / h**2
        vals[:, 1] = -2 * D / h**2 + kappa() * (1 - 2 * w)
        A.setValuesCSR(ptr, cols, vals.ravel())
        A.assemble()
        return True

    def jacobian_p(ts, t, u, C):
        w = u.getArray(readonly=True)
        C.setValues(rows, [0], (w * (1 - w))[:, None])
        C.assemble()
        return True

    u0 = da.createGlobalVec()
    u0.getArray()[:] = 0.3 + 0.2 * np.sin(2 * np.pi * (np.arange(xs, xe) + 0.5) * h)
    Jp = PETSc.Mat().createDense([(xe - xs, n), (1 if comm.rank == 0 else 0, 1)], comm=comm)
    Jp.setUp()
    ts = PETSc.TS().create(comm=comm)
    ts.setDM(da)
    ts.setType("cn")
    ts.setRHSFunction(rhs, u0.duplicate())
    ts.setRHSJacobian(jacobian, da.createMatrix())
    ts.setRHSJacobianP(jacobian_p, Jp)
    ts.setTimeStep(0.01)
    ts.setMaxSteps(STEPS)
    snes = ts.getSNES()
    snes.setTolerances(rtol=1e-13, atol=1e-14)
    snes.getKSP().setTolerances(rtol=1e-14, atol=1e-16)
    return ts, u0, k_vec


def _array(vec):
    return vec.getArray(readonly=True).copy()


def _agreed_refusal(comm, build):
    with pytest.raises(TSRefused) as exc:
        build()
    text = str(exc.value)
    assert "\n" not in text and len(set(comm.allgather(text))) == 1, text
    return text


def test_new_control_reaches_callbacks_that_read_the_vec(comm):
    """No apply_parameters: at k doubled J and the gradient are TSAdjointSolve's at k doubled."""
    ts, u0, k_vec = _reaction(comm)
    stepper = TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=_objective(N_POINTS))
    first = compute_gradient(stepper, stepper.default_controls())
    controls = stepper.default_controls()
    controls["k"].scale(2.0)
    mine = compute_gradient(stepper, controls)
    ref_ts, ref_u0, ref_k = _reaction(comm, k=4.0)
    theirs = tsadjoint_gradient(ref_ts, ref_u0, STEPS, _objective(N_POINTS), parameters=ref_k)
    assert mine.J == theirs.J and mine.J != first.J
    assert np.array_equal(_array(mine.gradient["u0"]), _array(theirs.lam0))
    assert np.array_equal(_array(mine.gradient["k"]), _array(theirs.mu))


def test_a_parameter_the_callbacks_never_read_is_refused_on_every_rank(comm):
    ts, u0, k_vec = _reaction(comm, reads="float")
    text = _agreed_refusal(comm, lambda: TSStepper(ts, u0, STEPS, parameters={"k": k_vec},
                                                    final=_objective(N_POINTS)))
    assert "parameter 'k' does not reach the TS" in text


def test_a_parameter_laid_out_unlike_the_jacobian_p_is_refused_on_every_rank(comm):
    """k owned by the last rank, the JacobianP's column by rank 0: on one rank the sizes agree."""
    ts, u0, k_vec = _reaction(comm, p_on_last=True)
    if comm.size == 1:
        TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=_objective(N_POINTS))
        return
    text = _agreed_refusal(comm, lambda: TSStepper(ts, u0, STEPS, parameters={"k": k_vec},
                                                    final=_objective(N_POINTS)))
    assert "parameters['k'] has 0 entries on rank 0 where 1 are expected (laid out differently)" in text


def test_a_parameter_laid_out_unlike_the_ijacobian_p_is_refused_on_every_rank(comm):
    """The IJacobianP (petsc4py cannot read it) compared where PETSc hands it to the callback, on every
    rank at once: on 3 ranks rank 1 owns no column and no entry, and must not run into the product's
    communication while ranks 0 and 2 fail."""
    ode = VanDerPol(comm, implicit=True)
    last = comm.size - 1
    mu = petsc().Vec().createMPI((1 if comm.rank == last else 0, 1), comm=comm)
    mu.set(10.0)

    def build():
        return TSStepper(ode.ts, ode.u0, 5, parameters={"mu": mu}, final=_objective(2))

    if comm.size == 1:
        build()
        return
    text = _agreed_refusal(comm, build)
    assert "parameters['mu'] has 0 entries on rank 0 where 1 are expected" in text and "IJacobianP" in text


def test_an_objective_that_differs_between_ranks_is_refused(comm):
    ts, u0, k_vec = _reaction(comm)
    local = (lambda u: float(np.sum(u.getArray(readonly=True) ** 2)), lambda u: u * 2.0)
    if comm.size == 1:
        TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=local)
        return
    text = _agreed_refusal(comm, lambda: TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=local))
    assert "final's value(u) differs between ranks" in text


def test_check_reports_what_applies(comm):
    ts, u0, k_vec = _reaction(comm)
    report = check_contract(TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=_objective(N_POINTS)), steps=2)
    assert report["adjoint_transpose"].status == "NOT CHECKED"
    for name in ("step_pure", "snapshot_round_trip", "adjoint_difference", "parameters_used"):
        assert report[name].status == "PASSED", (name, report[name].reason)


def test_a_gradient_of_the_wrong_kind_on_some_ranks_only_is_refused_on_every_rank(comm):
    """A Vec on rank 0, a numpy array elsewhere: one agreed line, no rank left in a collective."""
    ts, u0, k_vec = _reaction(comm)
    value, gradient = _objective(N_POINTS)

    def mixed_gradient(u):
        g = gradient(u)                                  # collective: made on every rank
        return g if comm.rank == 0 else g.getArray().copy()

    mixed = (value, mixed_gradient)
    if comm.size == 1:
        TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=mixed)
        return
    text = _agreed_refusal(comm, lambda: TSStepper(ts, u0, STEPS, parameters={"k": k_vec}, final=mixed))
    assert "final's gradient(u) returned a numpy.ndarray, not a PETSc Vec" in text
