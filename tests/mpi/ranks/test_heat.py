"""The heat model's adjoint on every rank count: Taylor, dot product, PETSc TSAdjoint, gradient file."""

import dataclasses

import numpy as np
import pytest

from hpcadj.adjoint import compute_gradient, dot_product_test, taylor_test
from hpcadj.models.heat import HeatModel
from hpcadj.models.heat_ts import heat_ts_gradient

CASES = [((20, 16), 0.5), ((20, 16), 1.0), ((8, 7, 6), 0.5)]


@pytest.fixture(params=CASES, ids=["2d-cn", "2d-be", "3d-cn"])
def problem(request, comm):
    grid, theta = request.param
    model = HeatModel(comm, grid, n_steps=12, dt=2e-3, theta=theta)
    controls = model.default_controls()
    return model, controls, compute_gradient(model, controls)


def test_store_all_counts(problem):
    model, _controls, result = problem
    assert result.forward_steps == model.n_steps
    assert result.recomputed_steps == 0
    assert result.adjoint_steps == model.n_steps


@pytest.mark.parametrize("control", ["u0", "kappa"])
def test_taylor_remainder_is_second_order(problem, control):
    model, controls, result = problem
    taylor = taylor_test(model, controls, control, gradient=result)
    assert taylor.min_rate >= 1.95, taylor


def test_dot_product_tangent_vs_adjoint(problem):
    model, controls, result = problem
    dot = dot_product_test(model, controls, gradient=result)
    assert dot.relative_mismatch <= dot.limit <= 1e-8, dot


def test_dot_product_limit_fails_a_perturbed_adjoint(problem):
    """An adjoint gradient off by a relative 1e-8 in one control is outside the scaled limit."""
    model, controls, result = problem
    gradient = {name: vec.copy() for name, vec in result.gradient.items()}
    gradient["kappa"].scale(1 + 1e-8)
    dot = dot_product_test(model, controls, gradient=dataclasses.replace(result, gradient=gradient))
    assert dot.relative_mismatch > dot.limit, dot


def test_matches_petsc_tsadjoint(problem):
    model, controls, result = problem
    ts = heat_ts_gradient(model, controls)
    assert ts.steps == model.n_steps
    assert abs(ts.J - result.J) <= 1e-8 * abs(result.J)
    diff = result.gradient["u0"].copy()
    diff.axpy(-1.0, ts.grad_u0)
    assert diff.norm() <= 1e-8 * ts.grad_u0.norm()


def test_gradient_file_is_natural_ordered(problem, shared_tmp, comm):
    from hpcadj.fieldio import write_fields
    from hpcadj.imports import h5py

    model, _controls, result = problem
    path = f"{shared_tmp}/grad.h5"
    layouts = model.control_layout()
    write_fields(path, comm, layouts, model.control_arrays(result.gradient), prefix="grad_")
    with h5py().File(path, "r", driver="mpio", comm=comm) as f:
        for name, layout in layouts.items():
            dset = f[f"grad_{name}"]
            assert dset.shape == tuple(reversed(model.grid.sizes_xyz))
            mine = result.gradient[name].getArray().reshape(layout.shape)
            assert np.array_equal(dset[layout.slices], mine)


def test_default_initial_condition_in_natural_order(comm):
    """u_0 at node (x_i, y_j) must be the formula evaluated there, whatever the decomposition."""
    model = HeatModel(comm, (9, 5), n_steps=1)
    u0 = model.default_controls()["u0"]
    layout = model.snapshot_layout()["u"]
    j, i = np.meshgrid(np.arange(5), np.arange(9), indexing="ij")
    x, y = (i + 1) / 10.0, (j + 1) / 6.0
    expected = np.sin(np.pi * x) * np.sin(np.pi * y) + 0.5 * np.sin(3 * np.pi * x) * np.sin(2 * np.pi * y)
    assert np.allclose(u0.getArray().reshape(layout.shape), expected[layout.slices], rtol=0, atol=1e-15)


@pytest.mark.parametrize("grid", [(20, 16), (8, 7, 6), (13, 9, 11)])
def test_shell_operator_is_bitwise_the_assembled_matrix(comm, grid):
    """The matrix-free A x and diag(A) equal the assembled AIJ matrix's bit for bit (any rank count)."""
    model = HeatModel(comm, grid, n_steps=2, dt=2e-3)
    controls = model.default_controls()
    rng = np.random.default_rng(11 + comm.rank)
    model.grid.owned(controls["kappa"])[...] = 0.5 + rng.random(model.grid.shape)
    model.set_controls(controls)
    assembled = model.assemble_matrix(controls["kappa"])
    x = model.grid.vec_from(rng.standard_normal(model.grid.shape))
    products = [x.duplicate() for _ in range(4)]
    assembled.mult(x, products[0])
    model.A.mult(x, products[1])
    assembled.getDiagonal(products[2])
    model.A.getDiagonal(products[3])
    assert np.array_equal(products[0].getArray(), products[1].getArray())
    assert np.array_equal(products[2].getArray(), products[3].getArray())
    assert np.abs(products[1].getArray() - x.getArray()).max() > 0  # A is not the identity here
    assembled.destroy()
