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
