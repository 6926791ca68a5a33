"""Gray-Scott (backward Euler, SNES Newton): gradient checks and rank-count invariance.

Diffusion is raised above the default so the Laplacian's share of the adjoint is tested, not hidden.
"""

import pytest

from hpcadj.models.grayscott import GrayScottModel

from model_checks import (check_dot_product, check_rank_invariance, check_restart_across_ranks,
                           check_taylor)


def build(comm):
    return GrayScottModel(comm, (10, 9), n_steps=6, length=1.0, du=2e-3, dv=1e-3)


@pytest.mark.parametrize("control", ["u0", "F", "k"])
def test_taylor(comm, control):
    check_taylor(comm, build, control)


def test_dot_product(comm):
    check_dot_product(comm, build, tol=1e-10)


def test_rank_invariance(comm):
    check_rank_invariance(comm, build, rtol=1e-10)


def test_restart_across_ranks(comm):
    check_restart_across_ranks(comm, build, rtol=1e-10)


def test_step_is_pure(comm):
    """The same step twice, with other steps in between, gives bitwise the same state."""
    import numpy as np

    model = build(comm)
    model.set_controls(model.default_controls())
    u0 = model.initial_state()
    first = model.step(0, u0)
    model.step(1, first)
    again = model.step(0, u0)
    assert np.array_equal(first.getArray(), again.getArray())


def test_assembled_jacobian_is_the_residual_derivative(comm):
    """J(w) x equals the central difference of the compiled residual G along x (to 1e-7 relative)."""
    import numpy as np

    from hpcadj.models import kernels

    model = build(comm)
    model.set_controls(model.default_controls())
    w = model.initial_state()
    rng = np.random.default_rng(3 + comm.rank)
    x = w.duplicate()
    x.getArray()[...] = rng.standard_normal(x.getLocalSize())
    model._jac.set_state(model, kernels.owned(model.grid, w))
    jx = w.duplicate()
    model._jac.mat.mult(x, jx)
    model._base = kernels.owned(model.grid, w)
    eps = 1e-6
    sides = []
    for sign in (1.0, -1.0):
        ws = w.copy()
        ws.axpy(sign * eps, x)
        g = w.duplicate()
        model._residual(None, ws, g)
        sides.append(g)
    model._base = None
    fd = sides[0].copy()
    fd.axpy(-1.0, sides[1])
    fd.scale(1.0 / (2 * eps))
    fd.axpy(-1.0, jx)
    assert fd.norm() <= 1e-7 * jx.norm(), (fd.norm(), jx.norm())


def test_adjoint_and_tangent_are_pure(comm):
    """An adjoint or tangent step repeated after other solves (other states) is bitwise the same."""
    import numpy as np

    model = build(comm)
    controls = model.default_controls()
    model.set_controls(controls)
    u0 = model.initial_state()
    u1 = model.step(0, u0)
    u2 = model.step(1, u1)
    grad = {k: v.duplicate() for k, v in controls.items()}
    for v in grad.values():
        v.set(0.0)
    first = model.adjoint_step(1, u1, u2, u2, grad).getArray().copy()
    tangent = model.tangent_step(0, u0, u1, u0, controls).getArray().copy()
    model.adjoint_step(0, u0, u1, u2, grad)
    model.step(0, u0)
    assert np.array_equal(model.adjoint_step(1, u1, u2, u2, grad).getArray(), first)
    assert np.array_equal(model.tangent_step(0, u0, u1, u0, controls).getArray(), tangent)
