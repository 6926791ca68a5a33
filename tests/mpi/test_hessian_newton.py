"""TAO's trust-region Newton (bntr) with Gauss-Newton products through HessianShell fits the wave
model's traces far better than L-BFGS (lmvm) in the same number of iterations."""

import pytest

from hpcadj.adjoint import hessian as H
from hpcadj.adjoint.verify import compute_gradient

pytestmark = pytest.mark.timeout(300)
ITERATIONS = 6


def solve(comm, kind):
    """(final misfit, Hessian products) of ``ITERATIONS`` TAO iterations inverting c."""
    from hpcadj.inversion.space import ControlSpace
    from hpcadj.models.wave import WaveModel
    from hpcadj.imports import petsc

    PETSc = petsc()
    model = WaveModel(comm, (12, 10), n_steps=30)
    controls = model.default_controls()
    space = ControlSpace(controls, ["c"])

    def objective_gradient(tao, x, g):
        result = compute_gradient(model, space.unpack(x))
        space.pack(result.gradient, g)
        return result.J

    tao = PETSc.TAO().create(comm=comm)
    tao.setType(kind)
    tao.setSolution(space.pack(controls))
    tao.setObjectiveGradient(objective_gradient, space.new())
    shell = mat = None
    if kind == "bntr":
        shell = H.HessianShell(model, space, gauss_newton=True)
        mat = shell.matrix()
        tao.setHessian(shell.point, mat)
    tao.setTolerances(gatol=0.0, grtol=0.0)
    tao.setMaximumIterations(ITERATIONS)
    tao.solve()
    f0 = compute_gradient(model, controls).J
    out = (f0, tao.getObjectiveValue(), shell.count if shell else 0, tao.getIterationNumber())
    tao.destroy()
    if mat is not None:
        mat.destroy()
    return out


def test_gauss_newton_trust_region_beats_lbfgs(comm):
    f0, newton, products, its = solve(comm, "bntr")
    _, lbfgs, _, _ = solve(comm, "lmvm")
    assert its == ITERATIONS and products > ITERATIONS
    assert newton < 0.1 * lbfgs < 0.1 * f0, (f0, newton, lbfgs)
