"""An initial-condition inversion in the style of PETSc's ex5opt_ic: TAO (lmvm) on a Gray–Scott TS,
every objective and gradient a checkpointed hpcadj run under a 2-state RAM budget.

The final iterate is a control no earlier evaluation used: there the gradient is checked bitwise
against TSAdjointSolve on a second TS and by a Taylor test.
"""

import numpy as np

from hpcadj.adjoint.session import Checkpointing, GradientSession
from hpcadj.adjoint.verify import taylor_test
from hpcadj.imports import mpi, petsc
from hpcadj.ts import TSStepper
from hpcadj.ts.check import tsadjoint_gradient
from hpcadj.ts.examples import GrayScott

N, M = 8, 10


def _misfit(target):
    """J = ½ |u_n − target|² and its derivative."""
    def value(u):
        d = u - target
        return 0.5 * d.dot(d)

    return value, lambda u: u - target


def test_tao_inversion_of_the_initial_condition():
    PETSc = petsc()
    comm = mpi().COMM_WORLD
    truth = GrayScott(comm, m=M)
    observed = truth.stepper(N)
    observed.set_controls(observed.default_controls())
    u = observed.initial_state()
    for i in range(N):
        u = observed.step(i, u)
    target = u

    gs = GrayScott(comm, m=M)
    stepper = TSStepper(gs.ts, gs.u0, N, final=_misfit(target), name="ex5opt_ic")
    guess = gs.u0.copy()
    guess.scale(0.9)                                    # start away from the true initial condition
    evaluations = []

    def objective_gradient(tao, x, g):
        outcome = GradientSession(stepper, Checkpointing(ram=2, schedule="revolve"), controls={"u0": x}).solve()
        assert outcome.status == "complete", outcome.message
        assert outcome.result.recomputed_steps > 0
        outcome.result.gradient["u0"].copy(g)
        evaluations.append(outcome.result.J)
        return outcome.result.J

    tao = PETSc.TAO().create(comm=comm)
    tao.setType("lmvm")
    tao.setObjectiveGradient(objective_gradient, guess.duplicate())
    tao.setSolution(guess)
    tao.setMaximumIterations(4)
    tao.setTolerances(gatol=0.0, grtol=0.0, gttol=0.0)
    tao.solve()
    assert tao.getIterationNumber() >= 2, tao.getConvergedReason()
    assert evaluations[-1] < 0.05 * evaluations[0], evaluations

    x = tao.getSolution().copy()                        # the last iterate: not an evaluated control yet
    mine = GradientSession(stepper, Checkpointing(ram=2, schedule="revolve"), controls={"u0": x}).solve().result
    ref = GrayScott(comm, m=M)
    theirs = tsadjoint_gradient(ref.ts, x, N, _misfit(target))
    assert mine.J == theirs.J
    assert np.array_equal(mine.gradient["u0"].getArray(), theirs.lam0.getArray())
    result = taylor_test(stepper, {"u0": x}, "u0", eps0=1e-3, halvings=3, gradient=mine)
    assert result.min_rate >= 1.95, result.rates
