"""Gray-Scott (backward Euler, SNES Newton): gradient checks and rank-count invariance.

Diffusion is raised above the default so the Laplacian's share of the adjoint is tested, not hidden.
Every check runs with the default stencil (matrix-free) Jacobian and with the assembled one.
"""

import functools

import pytest

from hpcadj.models.grayscott import GrayScottModel

from model_checks import (check_dot_product, check_rank_invariance, check_restart_across_ranks,
                           check_taylor)


def _build(comm, jacobian="stencil"):
    return GrayScottModel(comm, (10, 9), n_steps=6, length=1.0, du=2e-3, dv=1e-3, jacobian=jacobian)


@pytest.fixture(params=GrayScottModel.JACOBIANS)
def build(request):
    return functools.partial(_build, jacobian=request.param)


@pytest.mark.parametrize("control", ["u0", "F", "k"])
def test_taylor(comm, build, control):
    check_taylor(comm, build, control)


def test_dot_product(comm, build):
    check_dot_product(comm, build, tol=1e-10)


def test_rank_invariance(comm, build):
    check_rank_invariance(comm, build, rtol=1e-10)


def test_restart_across_ranks(comm, build):
    check_restart_across_ranks(comm, build, rtol=1e-10)


def test_stencil_and_assembled_jacobians_agree(comm):
    """The two Jacobians give the same J and gradients to the solver tolerances (1e-10 relative)."""
    import numpy as np

    from hpcadj.adjoint import compute_gradient

    results = []
    for jacobian in GrayScottModel.JACOBIANS:
        model = _build(comm, jacobian)
        result = compute_gradient(model, model.default_controls())
        results.append((result.J, {k: v.getArray().copy() for k, v in result.gradient.items()}))
    (J0, g0), (J1, g1) = results
    assert abs(J0 - J1) <= 1e-10 * abs(J0)
    for name in g0:
        scale = comm.allreduce(float(np.max(np.abs(g0[name]), initial=0.0)), op=max_op())
        assert comm.allreduce(float(np.max(np.abs(g0[name] - g1[name]), initial=0.0)), op=max_op()) <= 1e-10 * scale


def max_op():
    from hpcadj.imports import mpi

    return mpi().MAX


def test_bad_jacobian_is_refused(comm):
    with pytest.raises(ValueError, match="stencil"):
        _build(comm, "dense")


def test_step_is_pure(comm, build):
    """The same step twice, with other steps in between, gives bitwise the same state."""
    import numpy as np

    model = build(comm)
    model.set_controls(model.default_controls())
    u0 = model.initial_state()
    first = model.step(0, u0)
    model.step(1, first)
    again = model.step(0, u0)
    assert np.array_equal(first.getArray(), again.getArray())


def test_jacobian_is_the_residual_derivative(comm, build):
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


def test_jacobian_transpose_is_the_adjoint(comm, build):
    """<J(w) x, y> = <x, J(w)^T y> for random x, y (to 1e-13 relative): the adjoint's operator."""
    import numpy as np

    from hpcadj.models import kernels

    model = build(comm)
    model.set_controls(model.default_controls())
    w = model.step(0, model.initial_state())
    rng = np.random.default_rng(5 + comm.rank)
    x, y, jx, jty = (w.duplicate() for _ in range(4))
    for v in (x, y):
        v.getArray()[...] = rng.standard_normal(v.getLocalSize())
    model._jac.set_state(model, kernels.owned(model.grid, w))
    model._jac.mat.mult(x, jx)
    model._jac.mat.multTranspose(y, jty)
    left, right = jx.dot(y), x.dot(jty)
    assert abs(left - right) <= 1e-13 * jx.norm() * y.norm(), (left, right)


def test_adjoint_and_tangent_are_pure(comm, build):
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
