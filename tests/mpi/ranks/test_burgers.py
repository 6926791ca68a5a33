"""Burgers (SSP-RK3, central skew-symmetric advection): gradient checks and rank-count invariance."""

import numpy as np
import pytest

from hpcadj.models.burgers import BurgersModel

from model_checks import (check_dot_product, check_rank_invariance, check_restart_across_ranks,
                           check_taylor)


def build(comm):
    return BurgersModel(comm, (12, 9), n_steps=8)


@pytest.mark.parametrize("control", ["u0", "nu"])
def test_taylor(comm, control):
    check_taylor(comm, build, control)


def test_dot_product(comm):
    check_dot_product(comm, build, tol=1e-12)


def test_rank_invariance(comm):
    # explicit and pointwise: states are bitwise equal, reductions (J, dJ/dnu) differ in the last bits
    check_rank_invariance(comm, build, rtol=1e-13)


def test_restart_across_ranks(comm):
    check_restart_across_ranks(comm, build, rtol=0.0)


def test_dt_is_stable_for_the_default_grid(comm):
    """The default dt keeps the kinetic energy bounded by its initial value (it may only decay)."""
    import numpy as np

    model = BurgersModel(comm, (32, 32), n_steps=200)
    model.set_controls(model.default_controls())
    u = model.initial_state()
    energies = [model.objective(model.n_steps, u)]
    for i in range(model.n_steps):
        u = model.step(i, u)
    energies.append(model.objective(model.n_steps, u))
    assert np.isfinite(energies[-1]) and 0 < energies[-1] < energies[0]


def test_split_state_layout_round_trips_through_snapshots_and_controls(comm):
    """The state stores (u, v) split; snapshots, the initial state, the initial tangent and dJ/du0
    keep the fields apart and the control u0 interleaved (a swapped or interleaved view fails here)."""
    import numpy as np

    from hpcadj.adjoint.verify import random_direction

    model = build(comm)
    controls = model.default_controls()
    controls["u0"] = random_direction(model, controls, seed=5)["u0"]
    model.set_controls(controls)
    pair = model.grid.owned_view(controls["u0"])
    for state in (model.initial_state(), model.initial_tangent(controls)):
        snap = model.snapshot(state)
        assert np.array_equal(snap["u"], pair[..., 0]) and np.array_equal(snap["v"], pair[..., 1])
        again = model.snapshot(model.restore({k: v.copy() for k, v in snap.items()}))
        assert all(np.array_equal(again[k], snap[k]) for k in snap)
        # views of the pooled state itself (a RAM level's by-reference hold) restore without a copy
        assert np.shares_memory(model.restore(snap).getArray(readonly=True), state.getArray(readonly=True))
    grad = {k: v.duplicate() for k, v in controls.items()}
    grad["u0"].set(0.0)
    model.initial_adjoint(model.initial_state(), grad)
    assert np.array_equal(model.grid.owned_view(grad["u0"]), pair)


@pytest.mark.parametrize("bufsize", [8192, 4096])
def test_sum_of_squares_is_numpys_of_the_interleaved_block(comm, bufsize):
    """J's sum, chunk by chunk, is bitwise np.sum(w * w) of the interleaved block, on a block larger
    than numpy's buffer (where numpy's own chunking shows), for two buffer sizes."""
    model = BurgersModel(comm, (150, 160), n_steps=2)
    model.set_controls(model.default_controls())
    u = model.step(0, model.initial_state())
    old = np.getbufsize()
    try:
        np.setbufsize(bufsize)
        w = model._interleaved(u)
        assert w.size > bufsize  # more than one chunk on every rank (1-3 ranks)
        assert model._sum_squares(u) == float(np.sum(w * w))
    finally:
        np.setbufsize(old)
